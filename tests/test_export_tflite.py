"""keras_vit.export.tflite's flatbuffer editing on a small converted model:
the labels metadata round trip, the op names, and that the interpreter runs
the labelled model exactly as converted."""

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.export import tflite


@pytest.fixture(scope="module")
def content():
    @tf.function(input_signature=[tf.TensorSpec((1, 4, 4, 3), tf.float32)])
    def classify(images):
        features = tf.nn.conv2d(images, tf.ones((2, 2, 3, 5)) / 12.0, 2, "VALID")  # (1, 2, 2, 5)
        return tf.nn.softmax(tf.reshape(features, (1, 20)))

    converter = tf.lite.TFLiteConverter.from_concrete_functions([classify.get_concrete_function()], classify)
    return converter.convert()


def test_labels_round_trip_and_replace_the_previous_entry(content):
    labels = ["cat", "dög", "", "two words"]  # any text, one class per line, empty names kept
    labelled = tflite.with_labels(content, labels)
    assert tflite.read_labels(content) is None
    assert tflite.read_labels(labelled) == labels
    relabelled = tflite.with_labels(labelled, ["z"])
    assert tflite.read_labels(relabelled) == ["z"]  # the first entry of that name: the old one is gone
    assert relabelled[4:8] == tflite.FILE_IDENTIFIER == content[4:8]


def test_the_labelled_model_runs_as_converted(content):
    labelled = tflite.with_labels(content, ["a", "b"])
    assert tflite.builtin_ops(labelled) == tflite.op_names(content) == ["CONV_2D", "RESHAPE", "SOFTMAX"]
    images = np.random.default_rng(0).uniform(0, 255, (2, 4, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(tflite.predict(labelled, images), tflite.predict(content, images))
