"""Input pipelines: the bundled digits, resumable and sharded streams, image
folders, TFRecords, evaluation padding, augmentations."""

import os

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.training import TrainConfig
from keras_vit.training import data as data_lib
from keras_vit.training import plan as plan_lib
from tests.training_helpers import plan_of

PIPELINE = ((28, 28), 1)


def _config(**overrides):
    settings = dict(model="Mu/4", dataset="mnist5k", batch_size=8, train_augment="affine", shuffle_buffer=1000)
    settings.update(overrides)
    return TrainConfig.create("scratch", **settings)


def _take(ds, n):
    return [{k: v.numpy() for k, v in batch.items()} for batch in ds.take(n)]


def test_mnist5k_is_read_from_the_package_and_split_once():
    (x_train, y_train), (x_test, y_test) = data_lib.load_mnist5k()
    assert x_train.shape == (4000, 28, 28, 1) and x_test.shape == (1000, 28, 28, 1)
    assert x_train.dtype == np.uint8 and x_train.max() == 255
    assert np.bincount(y_train, minlength=10).min() > 300 and set(y_test) == set(range(10))
    (x2, _), (x_test2, y_test2) = data_lib.load_mnist5k()
    np.testing.assert_array_equal(x_test, x_test2)
    np.testing.assert_array_equal(y_test, y_test2)
    train_rows = {row.tobytes() for row in x_train.reshape(4000, -1)}
    assert sum(row.tobytes() in train_rows for row in x_test.reshape(1000, -1)) < 5  # held out


def test_a_resumed_stream_continues_exactly_where_it_stopped():
    config = _config()
    source = data_lib.open_source(config)
    context = tf.distribute.InputContext(1, 0, 1)
    # 4000 examples, 8 a batch: 510 batches crosses into the second epoch.
    whole = _take(data_lib.train_dataset(source, plan_of(source, *PIPELINE, config=config), context, 0), 503)
    resumed = _take(data_lib.train_dataset(source, plan_of(source, *PIPELINE, config=config), context, 500 * 8), 3)
    for a, b in zip(whole[500:], resumed):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    assert -1.0 <= whole[0]["image"].min() and whole[0]["image"].max() <= 1.0
    # Epochs are shuffled differently, and augmented.
    assert not np.array_equal(whole[0]["label"], whole[500]["label"])


def test_workers_read_disjoint_shards():
    config = _config(train_augment="none")
    source = data_lib.open_source(config)
    # Two workers of one replica each: 4 of the global batch of 8 per worker.
    shards = [_take(data_lib.train_dataset(source, plan_of(source, *PIPELINE, config=config, num_replicas=2),
                                           tf.distribute.InputContext(2, i, 2), 0), 500)
              for i in range(2)]
    seen = [{img.tobytes() for batch in shard for img in batch["image"]} for shard in shards]
    assert len(seen[0]) > 1900 and len(seen[1]) > 1900 and len(seen[0] & seen[1]) < 20


def test_evaluation_is_padded_to_the_same_steps_on_every_worker():
    config = _config()
    source = data_lib.open_source(config)
    steps = plan_lib.eval_steps(source, 96)  # 1000 examples -> 11 steps of 96
    batches = [_take(data_lib.eval_dataset(source, plan_of(source, *PIPELINE, eval_batch=96, num_replicas=2), steps,
                                          tf.distribute.InputContext(2, i, 2)), 100)
               for i in range(2)]
    assert [len(b) for b in batches] == [steps, steps]
    assert {b["image"].shape[0] for worker in batches for b in worker} == {48}
    assert sum(float(b["weight"].sum()) for worker in batches for b in worker) == 1000


def test_augmentations_keep_the_shape_and_are_seeded():
    from keras_vit.training import augment as augment_lib

    source = data_lib.open_source(_config())
    image = tf.random.stateless_uniform((40, 30, 3), (0, 0), 0, 255)
    for kind in ("inception_crop_flip", "inception_crop", "flip", "affine", "translate", "none"):
        transform = augment_lib.example_transform(plan_of(source, (32, 32), 3, _config(train_augment=kind)))
        a = transform(image, tf.constant([1, 2], tf.int64))
        b = transform(image, tf.constant([1, 2], tf.int64))
        assert a.shape == (32, 32, 3), kind
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _png(value, size=(12, 10)):
    return tf.io.encode_png(tf.fill([*size, 3], tf.constant(value, tf.uint8))).numpy()


def test_image_folder_with_one_subfolder_per_class(tmp_path):
    for c, name in enumerate(["cat", "dog", "eel"]):
        os.makedirs(tmp_path / name)
        for i in range(10):
            (tmp_path / name / f"{i}.png").write_bytes(_png(40 * c + i))
    source = data_lib.open_source(_config(dataset=f"folder:{tmp_path}"))
    assert source.num_classes == 3 and source.sizes == {"train": 27, "eval": 3}
    pipeline = ((16, 16), 3)
    batch = next(iter(data_lib.eval_dataset(source, plan_of(source, *pipeline, eval_batch=3), 1, tf.distribute.InputContext(1, 0, 1))))
    assert batch["image"].shape == (3, 16, 16, 3)
    assert sorted(batch["label"].numpy()) == [0, 1, 2]
    # 9th file of each class, value 40 * c + 9, mapped to [-1, 1].
    np.testing.assert_allclose(batch["image"].numpy()[:, 0, 0, 0], [(40 * c + 9) / 127.5 - 1 for c in range(3)],
                               atol=1e-5)


def test_a_folder_under_home_is_found_as_folder_tilde(tmp_path, monkeypatch):
    """#30: `--dataset folder:~/photos` (the shell leaves that ~ alone) is the folder in the home directory."""
    for name in ("cat", "dog"):
        os.makedirs(tmp_path / "photos" / name)
        for i in range(10):
            (tmp_path / "photos" / name / f"{i}.png").write_bytes(_png(i))
    monkeypatch.setenv("HOME", str(tmp_path))
    source = data_lib.open_source(_config(dataset="folder:~/photos"))
    assert source.num_classes == 2 and source.sizes == {"train": 18, "eval": 2}


def test_classes_too_small_to_hold_out_an_image_say_why_and_the_fix(tmp_path):
    """#30: fewer than 10 images a class: every 10th is held out, so nothing is; a val/ folder fixes it."""
    for name in ("cat", "dog"):
        os.makedirs(tmp_path / name)
        for i in range(6):
            (tmp_path / name / f"{i}.png").write_bytes(_png(i))
    source = data_lib.open_source(_config(dataset=f"folder:{tmp_path}"))
    with pytest.raises(ValueError, match=r"every 10th image of each class is held out: give each class at least "
                                         r"10 images, or add a val/ folder"):
        plan_lib.eval_steps(source, 8)


def test_tfrecords_of_encoded_images(tmp_path):
    def write(path, values):
        with tf.io.TFRecordWriter(str(path)) as writer:
            for value, label in values:
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_png(value)])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
                writer.write(example.SerializeToString())

    write(tmp_path / "train-00000.tfrecord", [(i, i % 2) for i in range(6)])
    write(tmp_path / "validation-00000.tfrecord", [(100, 1), (200, 0)])
    (tmp_path / "labels.txt").write_text("even\nodd\n")
    source = data_lib.open_source(_config(dataset=f"tfrecord:{tmp_path}"))
    assert source.num_classes == 2 and source.sizes["eval"] == 2
    pipeline = ((12, 10), 3)
    batch = next(iter(data_lib.eval_dataset(source, plan_of(source, *pipeline, eval_batch=2), 1, tf.distribute.InputContext(1, 0, 1))))
    assert list(batch["label"].numpy()) == [1, 0]
    train = next(iter(data_lib.train_dataset(source, plan_of(source, *pipeline, config=_config(
                                                 dataset="x", batch_size=6, train_augment="none")),
                                             tf.distribute.InputContext(1, 0, 1), 0)))
    assert sorted(train["label"].numpy()) == [0, 0, 0, 1, 1, 1]


def test_unknown_dataset_names_say_what_exists():
    with pytest.raises(ValueError, match="tfds:NAME"):
        data_lib.open_source(_config(dataset="imagenet"))
