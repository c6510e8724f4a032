"""Issue #13 item 1: a `folder:` dataset of real-world files. Every kind Pillow
reads is used; files that do not decode are found before training, named in
one warning and left out (an error with --strict-data); an empty class folder
is an error naming it (dropped with --drop-empty-classes); one class warns."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.cli import main
from keras_vit.training import TrainConfig
from keras_vit.training import data as data_lib
from tests.training_helpers import plan_of
from tests import image_files

TRAIN = ["--model", "Nano/4", "--patch-size", "4", "--image-size", "16", "--recipe", "scratch", "--steps", "2",
         "--batch-size", "4", "--warmup-steps", "0", "--strategy", "default", "--no-jit", "--no-progress",
         "--checkpoint-every", "100"]


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    root = tmp_path_factory.mktemp("messy")
    kinds = {}
    for seed, name in enumerate(["cats", "dogs"]):
        kinds[name] = image_files.write_odd_and_broken(root / name, seed=seed)
    return root, kinds


def _config(root, **overrides):
    return TrainConfig.create("scratch", model="Nano/4", dataset=f"folder:{root}", progress=False, **overrides)


@pytest.mark.slow
def test_messy_folder_trains_through_the_cli_naming_the_broken_files(messy, tmp_path, capsys):
    root, kinds = messy
    assert main(["train", "--dataset", f"folder:{root}", "--workdir", str(tmp_path / "run"), *TRAIN]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "cannot be decoded" in line]
    assert len(warnings) == 1, err  # ONE warning, with a count, naming each broken file
    assert "6 of 30 image files cannot be decoded" in warnings[0]
    for name, (good, broken, ignored) in kinds.items():
        for f in broken:
            assert str(root / name / f) in warnings[0]
        for f in good + ignored:
            assert str(root / name / f) not in warnings[0]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["dataset"]["num_classes"] == 2
    assert sum(results["dataset"]["sizes"].values()) == 24  # every odd kind used: 12 per class


def test_every_odd_kind_is_decoded_by_the_training_pipeline(messy):
    root, kinds = messy
    source = data_lib.open_source(_config(root))
    assert source.class_names == ["cats", "dogs"] and source.num_classes == 2
    pipeline = ((16, 16), 3)
    ds = data_lib.plain_dataset(source, plan_of(source, *pipeline), "train", 64)
    batch = next(iter(ds))
    assert batch["image"].shape[0] == source.sizes["train"]
    assert np.isfinite(batch["image"].numpy()).all() and batch["image"].numpy().std() > 0.1
    # The pixels are keras_vit.images' (what predict and export read).
    paths = [path for path, _ in source.examples("train", 0, 1).as_numpy_iterator()]
    first = images_lib.resize(images_lib.decode(paths[0].decode(), 3), (16, 16))
    np.testing.assert_allclose(batch["image"].numpy()[0], images_lib.to_model_range(first), atol=1e-5)


def test_strict_data_stops_before_training(messy):
    root, _ = messy
    with pytest.raises(ValueError, match=r"6 of 30 image files cannot be decoded.*truncated\.jpg.*--strict-data"):
        data_lib.open_source(_config(root, strict_data=True))


def test_the_check_before_training_reads_headers_only(messy, monkeypatch):
    root, _ = messy
    monkeypatch.setattr(images_lib, "decode", None)  # no pixel is decoded before training
    source = data_lib.open_source(_config(root))
    assert source.sizes == {"train": 22, "eval": 2}  # 12 readable files a class, every 10th held out


def test_a_file_that_breaks_after_the_check_weighs_nothing_and_is_counted(messy, tmp_path, capsys):
    root = tmp_path / "late"
    shutil.copytree(messy[0], root)
    source = data_lib.open_source(_config(root))
    capsys.readouterr()  # the check's own warning
    victim = root / "cats" / "gray.png"
    victim.write_bytes(victim.read_bytes()[:60])  # damaged after the check, as on a flaky disk
    pipeline = ((16, 16), 3)
    config = _config(root, batch_size=22, train_augment="none")
    batch = next(iter(data_lib.train_dataset(source, plan_of(source, *pipeline, config=config), tf.distribute.InputContext(), 0)))
    assert sorted(batch["weight"].numpy().tolist()) == [0.0] + [1.0] * 21  # one epoch: the file once, weight 0
    assert source.problems.summary()["undecodable_files"] == 6 + 1  # left out before training, and this one
    assert str(victim) in source.problems.summary()["files"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "cannot be decoded" in line]
    assert len(warnings) == 1 and str(victim) in warnings[0] and "--strict-data" in warnings[0]
    data_lib.open_source(_config(messy[0]))  # another source, as an export's data would be
    assert source.problems.summary()["undecodable_files"] == 6 + 1  # this one's count stays (#38 item 8)


def test_strict_data_stops_at_a_file_that_breaks_after_the_check(messy, tmp_path):
    root = tmp_path / "late"
    shutil.copytree(messy[0], root)
    for name in ("cats", "dogs"):
        for broken in ("truncated.jpg", "zero.png", "bad_header.png"):
            os.remove(root / name / broken)
    source = data_lib.open_source(_config(root, strict_data=True))
    (root / "dogs" / "gray.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    config = _config(root, strict_data=True, batch_size=22, train_augment="none")
    ds = data_lib.train_dataset(source, plan_of(source, (16, 16), 3, config), tf.distribute.InputContext(), 0)
    with pytest.raises(Exception, match=r"gray\.png cannot be decoded.*--strict-data"):
        next(iter(ds))


def test_an_empty_class_folder_is_named_or_dropped(tmp_path, capsys):
    for name in ("ants", "bees"):
        image_files.write_odd_and_broken(tmp_path / name)
    os.makedirs(tmp_path / "empty_wasps")
    (tmp_path / "empty_wasps" / "readme.txt").write_text("no pictures yet")
    with pytest.raises(ValueError, match=r"empty_wasps.*--drop-empty-classes"):
        data_lib.open_source(_config(tmp_path))
    source = data_lib.open_source(_config(tmp_path, drop_empty_classes=True))
    assert source.num_classes == 2 and source.class_names == ["ants", "bees"]
    assert "dropping 1 empty class folder(s)" in capsys.readouterr().err
    # A class whose every file is broken is empty too.
    shutil.rmtree(tmp_path / "empty_wasps")
    os.makedirs(tmp_path / "broken_wasps")
    (tmp_path / "broken_wasps" / "x.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(ValueError, match="broken_wasps"):
        data_lib.open_source(_config(tmp_path))


def test_a_single_class_warns(tmp_path, capsys):
    image_files.write_odd_and_broken(tmp_path / "only")
    source = data_lib.open_source(_config(tmp_path))
    assert source.num_classes == 1
    assert "single class ('only')" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cli_names_a_file_that_breaks_in_training_and_counts_it(tmp_path, capsys):
    # A PNG cut after its header passes the check before training and fails when decoded.
    for name in ("ants", "bees"):
        _, broken, _ = image_files.write_odd_and_broken(tmp_path / "data" / name)
        for f in broken:
            os.remove(tmp_path / "data" / name / f)
    cut = tmp_path / "data" / "ants" / "cut.png"  # 13 ants, 12 bees: 23 train after holding out every 10th
    cut.write_bytes(image_files.encoded(image_files.picture(), "PNG")[:70])
    args = ["train", "--dataset", f"folder:{tmp_path / 'data'}", *TRAIN[:-2], "--checkpoint-every", "100",
            "--batch-size", "23", "--steps", "1"]  # one epoch of the training files
    assert main([*args, "--workdir", str(tmp_path / "strict"), "--strict-data"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("keras-vit train: error: ") and "cut.png cannot be decoded" in err[-1], err
    assert "--strict-data" in err[-1] and "Traceback" not in "\n".join(err)
    assert main([*args, "--workdir", str(tmp_path / "lenient")]) == 0
    results = json.loads((tmp_path / "lenient" / "results.json").read_text())
    assert results["data_problems"]["undecodable_files"] == 1
    assert any(path.endswith("cut.png") for path in results["data_problems"]["files"])
