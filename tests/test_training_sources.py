"""Training data as users have it (issue #13 item 2): `list:` CSV/JSON files of
(path, label), `train(config, dataset=...)` with a tf.data.Dataset, a (train,
eval) pair, or a keras.utils.image_dataset_from_directory dataset."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit import images as images_lib
from keras_vit.training import TrainConfig, train
from keras_vit.training import data as data_lib
from tests.training_helpers import plan_of
from tests.training_helpers import tiny_config


def _config(**overrides):
    return TrainConfig.create("scratch", model="Nano/4", progress=False, **overrides)


@pytest.fixture
def pictures(tmp_path):
    """3 classes x 10 PNGs of 12x10 in class folders; each picture's value encodes (class, index)."""
    for c, name in enumerate(["ant", "bee", "cat"]):
        os.makedirs(tmp_path / "pics" / name)
        for i in range(10):
            Image.fromarray(np.full((12, 10, 3), 80 * c + i, np.uint8)).save(tmp_path / "pics" / name / f"{i}.png")
    return tmp_path / "pics"


def _values(source, split):
    ds = data_lib.plain_dataset(source, plan_of(source, (12, 10), 3), split, 100)
    batch = next(iter(ds))
    return sorted(zip(np.round((batch["image"].numpy()[:, 0, 0, 0] + 1) * 127.5).astype(int).tolist(),
                      batch["label"].numpy().tolist()))


def test_list_csv_and_json_with_names_or_ids(pictures, tmp_path):
    rows = [(f"pics/{name}/{i}.png", name) for name in ("bee", "ant", "cat") for i in range(10)]
    (tmp_path / "all.csv").write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows))
    source = data_lib.open_source(_config(dataset=f"list:{tmp_path / 'all.csv'}"))
    assert source.class_names == ["ant", "bee", "cat"] and source.sizes == {"train": 27, "eval": 3}
    assert _values(source, "eval") == [(9, 0), (89, 1), (169, 2)]  # every 10th of each class held out
    # JSON, integer labels, a separate evaluation list.
    (tmp_path / "train.json").write_text(json.dumps([[f"pics/ant/{i}.png", 0] for i in range(8)]
                                                    + [{"path": f"pics/cat/{i}.png", "label": 2} for i in range(8)]))
    (tmp_path / "eval.json").write_text(json.dumps([["pics/bee/0.png", 1], ["pics/cat/9.png", 2]]))
    spec = f"list:{tmp_path / 'train.json'},{tmp_path / 'eval.json'}"
    with pytest.raises(ValueError, match=r"class\(es\) hold no readable images: '1'"):
        data_lib.open_source(_config(dataset=spec))
    # Integer labels keep their values: class 2 stays 2 (not renumbered to 1), class 1 keeps its output.
    source = data_lib.open_source(_config(dataset=spec, drop_empty_classes=True))
    assert source.class_names == ["0", "1", "2"] and source.sizes == {"train": 16, "eval": 2}
    assert _values(source, "eval") == [(80, 1), (169, 2)]


@pytest.mark.slow
def test_train_on_a_tf_data_dataset_holds_out_every_10th_example(tmp_path):
    (x, y), _ = data_lib.load_mnist5k()
    ds = tf.data.Dataset.from_tensor_slices((x[:200], y[:200]))
    source = data_lib.open_source(_config(), ds)
    assert source.sizes == {"train": 180, "eval": 20} and source.num_classes == 10 and source.num_channels == 1
    held = np.stack([image for image, _ in source.examples("eval", 0, 1).as_numpy_iterator()])
    np.testing.assert_array_equal(held, x[9:200:10])
    results = train(tiny_config(tmp_path / "run", steps=2, eval_batch_size=20), dataset=ds)
    assert results["steps"] == 2 and 0 <= results["eval"]["accuracy"] <= 1
    assert json.loads((tmp_path / "run" / "results.json").read_text())["dataset"]["sizes"] == {"train": 180,
                                                                                                "eval": 20}


def test_a_train_eval_pair_of_batched_dict_datasets():
    (x, y), (xt, yt) = data_lib.load_mnist5k()
    train_ds = tf.data.Dataset.from_tensor_slices({"image": x[:64], "label": y[:64]}).batch(16)
    eval_ds = tf.data.Dataset.from_tensor_slices({"image": xt[:30], "label": yt[:30]}).batch(16)
    source = data_lib.open_source(_config(num_classes=10), (train_ds, eval_ds))
    assert source.sizes == {"train": 64, "eval": 30} and source.num_classes == 10
    with pytest.raises(ValueError, match="tf.data.Dataset"):
        data_lib.open_source(_config(), [1, 2, 3])


@pytest.mark.slow
def test_a_keras_directory_dataset_is_reread_through_keras_vit_images(pictures, tmp_path):
    ds = keras.utils.image_dataset_from_directory(str(pictures), image_size=(6, 6), batch_size=4, seed=1)
    source = data_lib.open_source(_config(), ds)
    assert source.class_names == ["ant", "bee", "cat"] and source.sizes == {"train": 27, "eval": 3}
    assert _values(source, "eval") == [(9, 0), (89, 1), (169, 2)]  # the files at their own size, not 6x6
    train_ds, val_ds = (keras.utils.image_dataset_from_directory(
        str(pictures), validation_split=0.2, subset=subset, seed=1, image_size=(12, 10)) for subset in
        ("training", "validation"))
    source = data_lib.open_source(_config(), (train_ds, val_ds))
    assert source.sizes == {"train": 24, "eval": 6}
    results = train(tiny_config(tmp_path / "run", steps=2, image_size=28, eval_batch_size=6), dataset=(train_ds, val_ds))
    assert results["steps"] == 2
    path = train_ds.file_paths[0]
    source = data_lib.open_source(_config(), (train_ds, val_ds))
    pixels = next(iter(data_lib.plain_dataset(source, plan_of(source, (12, 10), 3), "train", 1)))
    assert pixels["image"].shape == (1, 12, 10, 3) and images_lib.decode(path).shape == (12, 10, 3)


def test_a_list_with_no_images_is_an_error_and_one_class_warns(pictures, tmp_path, capsys):
    """The class checks of folders, for lists too (#29)."""
    (tmp_path / "empty.csv").write_text("path,label\n")
    with pytest.raises(ValueError, match="holds no images in any class"):
        data_lib.open_source(_config(dataset=f"list:{tmp_path / 'empty.csv'}"))
    (tmp_path / "one.csv").write_text("".join(f"pics/ant/{i}.png,ant\n" for i in range(10)))
    capsys.readouterr()
    source = data_lib.open_source(_config(dataset=f"list:{tmp_path / 'one.csv'}"))
    assert source.num_classes == 1 and "a single class ('ant')" in capsys.readouterr().err
