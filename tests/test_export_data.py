"""Export validation data: the held-out MNIST digits only, and samples drawn
across classes (seeded) with calibration kept out of validation."""

import json

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.export import data as data_lib
from keras_vit.data.mnist5k import split as load_mnist5k


def test_data_mnist_is_the_1000_held_out_test_digits_of_the_one_reader():
    digits = data_lib.read("mnist")
    (train_images, _), (test_images, test_labels) = load_mnist5k()
    assert len(digits) == 1000 and "held-out" in digits.source
    np.testing.assert_array_equal(digits.images, test_images.astype(np.float32))
    np.testing.assert_array_equal(digits.labels, test_labels)
    train_rows = {row.tobytes() for row in train_images.reshape(len(train_images), -1)}
    assert sum(row.astype(np.uint8).tobytes() in train_rows for row in digits.images.reshape(1000, -1)) < 5
    # "all" is the same 5,000 digits the trainer reads, shuffled.
    every = data_lib.mnist_digits(seed=0)
    assert sorted(map(bytes, every.images.astype(np.uint8).reshape(5000, -1))) == sorted(
        map(bytes, np.concatenate([train_images, test_images]).reshape(5000, -1)))


def _sorted_by_class(num_classes=10, per_class=30):
    images = np.arange(num_classes * per_class, dtype=np.float32)[:, None, None, None] * np.ones((1, 4, 4, 1))
    labels = np.repeat(np.arange(num_classes), per_class)
    return data_lib.Images(images, labels, "sorted")


def test_samples_go_across_classes_seeded_and_calibration_is_held_out():
    data = _sorted_by_class()
    picked = data_lib.sample(data, 50)
    assert np.bincount(picked.labels, minlength=10).tolist() == [5] * 10  # not the first 2 classes
    np.testing.assert_array_equal(data_lib.sample(data, 50).images, picked.images)  # seeded
    calibration, validation, held_out = data_lib.split_calibration(data, 40)
    assert held_out and len(calibration) == 40 and len(validation) == 260
    assert np.bincount(calibration.labels, minlength=10).tolist() == [4] * 10
    assert not set(calibration.images[:, 0, 0, 0]) & set(validation.images[:, 0, 0, 0])
    assert data_lib.describe(calibration) == "40 images of 10 classes"
    # Too few to spare any: calibration comes from the validation images, and says so.
    calibration, validation, held_out = data_lib.split_calibration(data_lib.sample(data, 60), 40)
    assert not held_out and len(validation) == 60 and len(calibration) == 40


@pytest.mark.slow
def test_export_cli_samples_a_class_sorted_folder_across_classes(tmp_path, capsys):
    from keras_vit.cli import main

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(keras_vit.ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1),
                          image_size=8, num_classes=10, num_channels=3)
    model.save(tmp_path / "tiny.keras")
    rng = np.random.default_rng(0)
    for c in range(10):
        (tmp_path / "data" / f"class{c}").mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3)).astype(np.uint8)).save(
                tmp_path / "data" / f"class{c}" / f"{i:02d}.png")
    code = main(["export", str(tmp_path / "tiny.keras"), "--formats", "tflite,tflite-int8", "--out",
                 str(tmp_path / "out"), "--data", str(tmp_path / "data"), "--num-calibration", "30",
                 "--num-validation", "50", "--latency-runs", "1"])
    out = capsys.readouterr().out
    assert code in (0, 1)  # a random model may miss the int8 gate; the data lines are what is tested
    assert ("validating on 50 images of 10 classes" in out
            and "int8 calibration on 30 images of 10 classes, kept out of validation" in out), out
    report = json.loads((tmp_path / "out" / "report.json").read_text())["validation"]
    assert report["num_images"] == 50 and report["num_classes"] == 10
    assert report["calibration_images"] == 30 and report["calibration_classes"] == 10
    assert report["calibration_held_out"] is True and "stratified" in report["sampling"]
