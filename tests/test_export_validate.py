"""The pieces every export leans on, at the cost of a unit test (make test-fast's share of
keras_vit.export; the exports themselves are slow tests): the in-graph image decoder
against keras_vit.images, and validation of an artifact in a fresh process."""

import os

import numpy as np
import tensorflow as tf
from PIL import Image

from keras_vit import images
from keras_vit.export import image_bytes, validate

from . import image_files


def test_the_traced_decoder_reads_bytes_as_keras_vit_images():
    """EXIF orientation (a JPEG stored 24x20, shown 20x24), a palette PNG, a 16-bit PNG and
    a grey JPEG, as RGB: the graph's pixels are keras_vit.images' pixels. (One channel count:
    each traces the decoder, ~2 s; grey models' decoding is the slow serving-bytes tests'.)"""
    rgb = image_files.picture()
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    exif = Image.Exif()
    exif[0x0112] = 6
    payloads = [image_files.encoded(np.rot90(rgb), "JPEG", quality=90, exif=exif),
                image_files.encoded(rgb, "PNG", "P"), image_files.png16_rgb(rgb),
                image_files.encoded(gray, "JPEG", quality=90)]
    for payload in payloads:
        got = image_bytes.decode(tf.constant(payload), 3).numpy()
        np.testing.assert_array_equal(got, images.decode(payload, 3))
    assert image_bytes.decode(tf.constant(payloads[0]), 3).shape == (20, 24, 3)


def _softmax_tflite(path, weights):
    """A TFLite file of softmax(mean over the pixels of the image @ weights): the runner's
    contract (one image input, probabilities out) without a model to convert."""
    kernel = tf.constant(weights)

    @tf.function(input_signature=[tf.TensorSpec((1, 4, 4, 3), tf.float32)])
    def serve(images):
        return tf.nn.softmax(tf.reduce_mean(images, axis=(1, 2)) @ kernel)

    converter = tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], serve)
    with open(path, "wb") as f:
        f.write(converter.convert())


def test_validate_runs_the_artifact_in_a_fresh_process_and_compares_with_keras(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(3, 5)).astype(np.float32)
    artifact = str(tmp_path / "model.tflite")
    _softmax_tflite(artifact, weights)
    pixels = rng.uniform(-1, 1, (6, 4, 4, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", pixels)
    logits = pixels.mean(axis=(1, 2)) @ weights
    reference = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = reference.argmax(-1)
    names = [f"class {i}" for i in range(5)]

    row = validate.validate("tflite", artifact, str(tmp_path / "images.npy"), reference, labels, names,
                            str(tmp_path), latency_runs=1)
    assert row["passed"], row["failures"]
    assert row["max_abs_diff"] < 1e-5 and row["top1_agreement"] == 1.0
    assert row["size_bytes"] == os.path.getsize(artifact) and row["latency_ms"] > 0

    # Keras said otherwise for every image: the row fails on agreement, naming it.
    other = np.roll(reference, 1, axis=-1)
    row = validate.validate("tflite", artifact, str(tmp_path / "images.npy"), other, labels, names,
                            str(tmp_path), latency_runs=1)
    assert not row["passed"] and row["top1_agreement"] < 1.0
    assert any("agreement" in failure or "diff" in failure for failure in row["failures"]), row["failures"]
