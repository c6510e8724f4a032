import numpy as np
import pytest
import tensorflow as tf

from keras_vit.layers import StdConv2D
from keras_vit.layers.std_conv import same_padding
from tests.layers.helpers import assert_config_round_trip


def standardise(w, eps=1e-5):
    mean = w.mean(axis=(0, 1, 2), keepdims=True)
    std = w.std(axis=(0, 1, 2), keepdims=True)  # population std, as jnp.std
    return (w - mean) / (std + eps)


@pytest.mark.parametrize("size,kernel,stride", [(224, 7, 2), (15, 3, 2), (16, 3, 2), (9, 1, 1), (10, 1, 2)])
def test_same_padding_matches_tensorflow(size, kernel, stride):
    # TF's 'SAME' (what the official XLA code uses) as the reference.
    x = tf.ones((1, size, 1, 1))
    out = tf.nn.conv2d(x, tf.ones((kernel, 1, 1, 1)), strides=stride, padding="SAME")
    before, after = same_padding(size, kernel, stride)
    assert (size + before + after - kernel) // stride + 1 == out.shape[1]
    # The extra pixel goes after (bottom/right): the first output sums kernel - before pixels.
    assert float(out[0, 0, 0, 0]) == kernel - before


@pytest.mark.parametrize("size,stride", [(16, 2), (15, 2), (8, 1)])
def test_matches_standardised_tf_conv(rng, size, stride):
    layer = StdConv2D(filters=6, kernel_size=3, strides=stride)
    x = rng.normal(size=(2, size, size, 4)).astype("float32")
    out = np.asarray(layer(x))
    w = np.asarray(layer.kernel)
    expected = tf.nn.conv2d(x, standardise(w).astype("float32"), strides=stride, padding="SAME").numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_stores_the_raw_kernel(rng):
    layer = StdConv2D(4, 1)
    layer.build((None, 4, 4, 3))
    raw = rng.normal(size=(1, 1, 3, 4)).astype("float32") * 5 + 2
    layer.set_weights([raw])
    np.testing.assert_array_equal(np.asarray(layer.kernel), raw)


def test_config_round_trip(rng):
    assert_config_round_trip(StdConv2D(4, 3, 2), rng.normal(size=(1, 8, 8, 3)).astype("float32"))
