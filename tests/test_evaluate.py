"""`keras-vit evaluate MODEL DATA` (#39: predict, inspect, evaluate and export read any run): its
accuracy is the trainer's own on the same 1,000 held-out digits, a folder's classes are matched to
the model's by name, and what it cannot measure is one line."""

import json

import numpy as np
import pytest
from PIL import Image

from keras_vit.cli import main
from keras_vit.export.data import mnist_digits


def _evaluate(capsys, *args):
    code = main(["evaluate", *map(str, args), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_the_accuracy_is_the_trainer_s_on_the_held_out_digits(digits_run, capsys):
    figures = _evaluate(capsys, digits_run, "mnist")
    trained = json.loads((digits_run / "results.json").read_text())["eval"]
    assert figures["images"] == trained["num_examples"] == 1000 and figures["classes"] == 10
    assert figures["top1"] == pytest.approx(trained["accuracy"], abs=1e-9)
    assert figures["top5"] == pytest.approx(trained["top5"], abs=1e-9)
    per_class = figures["per_class"]
    assert sum(c["images"] for c in per_class.values()) == 1000
    assert sum(c["images"] * c["top1"] for c in per_class.values()) == pytest.approx(1000 * figures["top1"])


def test_a_folder_s_classes_are_the_model_s_of_their_names(digits_run, tmp_path, capsys):
    """Two of the digits' classes as folders named for them: each class's accuracy is its own in the
    whole set's, not that of the classes at the folders' positions (0 and 1)."""
    whole = _evaluate(capsys, digits_run, "mnist")["per_class"]
    ranked = sorted(whole, key=lambda c: (-whole[c]["top1"], c))
    chosen = sorted([ranked[0], ranked[-1]])  # the best and the worst class: a mix-up shows
    assert [whole[c]["top1"] for c in chosen] != [whole[c]["top1"] for c in ("0", "1")]
    digits = mnist_digits(split="test")
    for name in chosen:
        (tmp_path / name).mkdir()
        for i in np.flatnonzero(digits.labels == int(name)):
            Image.fromarray(digits.images[i, ..., 0].astype(np.uint8)).save(tmp_path / name / f"{i}.png")
    figures = _evaluate(capsys, digits_run, tmp_path)
    assert figures["per_class"] == {name: whole[name] for name in chosen}


def test_a_folder_is_read_a_chunk_at_a_time_and_sampled_before_decoding(tmp_path, monkeypatch):
    """export.data.chunks: the same images as load then sample, whatever the chunk size; the files
    sampled before decoding (a file left out is never opened)."""
    from keras_vit import images as images_lib
    from keras_vit.export import data as data_lib

    digits = mnist_digits(split="test")
    for name in ("3", "5"):
        (tmp_path / name).mkdir()
        for i in np.flatnonzero(digits.labels == int(name))[:7]:
            Image.fromarray(digits.images[i, ..., 0].astype(np.uint8)).save(tmp_path / name / f"{i:04d}.png")
    whole = data_lib.sample(data_lib.load(str(tmp_path), (28, 28), 1), 6)
    parts = list(data_lib.chunks(str(tmp_path), (28, 28), 1, limit=6, size=4))
    assert [len(part) for part in parts] == [4, 2]
    np.testing.assert_array_equal(np.concatenate([p.images for p in parts]), whole.images)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), whole.labels)
    loaded = data_lib.load_sample(str(tmp_path), (28, 28), 1, 6)
    np.testing.assert_array_equal(loaded.images, whole.images)
    opened = []
    monkeypatch.setattr(images_lib, "decode", lambda path, *a, decode=images_lib.decode: opened.append(path) or
                        decode(path, *a))
    assert len(data_lib.load_sample(str(tmp_path), (28, 28), 1, 3)) == 3 and len(opened) == 3


def test_what_cannot_be_measured_is_one_line(digits_run, tmp_path, capsys):
    (tmp_path / "cats" / "tabby").mkdir(parents=True)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "cats" / "tabby" / "0.png")
    np.save(tmp_path / "unlabelled.npy", np.zeros((2, 28, 28), np.uint8))
    np.savez(tmp_path / "labels.npz", images=np.zeros((2, 28, 28), np.uint8), labels=np.array([3, 12]))
    (tmp_path / "digits" / "7").mkdir(parents=True)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "digits" / "7" / "0.png")
    (tmp_path / "labels.txt").write_text("\n".join(["7", "1", "2", "3", "4", "5", "6", "7", "8", "9"]))
    assert main(["evaluate", str(digits_run), str(tmp_path / "digits"), "--labels", str(tmp_path / "labels.txt")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "the model has more than one class named 7" in error[0], error
    for data, message in ((tmp_path / "cats", "has classes the model does not know: tabby"),
                          (tmp_path / "unlabelled.npy", "has no labels"),
                          (tmp_path / "labels.npz", "has labels 3..12, and the model 10 classes")):
        assert main(["evaluate", str(digits_run), str(data)]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0], error


def test_classes_without_names_are_matched_by_position_only_when_as_many():
    from keras_vit.cli.evaluate import _model_ids
    from keras_vit.errors import UserError

    np.testing.assert_array_equal(_model_ids([1, 0, 2], ["a", "b", "c"], None, 3, "photos"), [1, 0, 2])
    with pytest.raises(UserError, match="2 class folders and the model 3 classes without names, so they cannot be "
                                        "matched: give the model's class names with --labels"):
        _model_ids([1, 0], ["a", "b"], None, 3, "photos")
    # An empty class folder the model does not know is no class of the data: only labelled ones are matched.
    np.testing.assert_array_equal(_model_ids([1, 1], ["empty", "cat"], ["dog", "cat"], 2, "photos"), [1, 1])
