"""The fused GELU kernel against TensorFlow's own op and autodiff."""

import numpy as np
import pytest

from keras_vit.layers import fused


def _value_and_gradient(fn, x):
    import tensorflow as tf

    weights = tf.constant(np.random.default_rng(1).normal(size=x.shape).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        loss = tf.reduce_sum(tf.cast(y, "float32") * weights)
    return [y, tape.gradient(loss, x)]


CASES = {  # (kernel, TensorFlow's own op)
    "gelu_tanh": (lambda x: fused.gelu(x, approximate=True),
                  lambda x: __import__("tensorflow").nn.gelu(x, approximate=True)),
    "gelu_erf": (lambda x: fused.gelu(x, approximate=False),
                 lambda x: __import__("tensorflow").nn.gelu(x, approximate=False)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_tensorflow_autodiff(name, rng):
    import tensorflow as tf

    x = tf.constant(rng.normal(size=(3, 7, 24)).astype("float32") * 2.0)
    kernel, reference = CASES[name]
    got, want = _value_and_gradient(kernel, x), _value_and_gradient(reference, x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_in_bfloat16_out_computed_in_float32(name, rng):
    import tensorflow as tf

    x32 = rng.normal(size=(2, 5, 16)).astype("float32")
    x = tf.cast(tf.constant(x32), "bfloat16")
    kernel, reference = CASES[name]
    got = _value_and_gradient(kernel, x)
    assert got[0].dtype == got[1].dtype == tf.bfloat16
    # Against the float32 reference on the same (bfloat16-rounded) inputs: only output rounding differs.
    want = _value_and_gradient(reference, tf.cast(x, "float32"))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(tf.cast(a, "float32")), np.asarray(b), rtol=2e-2, atol=2e-2)


def test_inside_an_xla_compiled_step_too(rng):
    import tensorflow as tf

    x = tf.constant(rng.normal(size=(2, 4, 8)).astype("float32"))

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.softmax(fused.gelu(x, approximate=True)) ** 2)
        return tape.gradient(loss, x)

    def plain(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.softmax(tf.nn.gelu(x, approximate=True)) ** 2)
        return tape.gradient(loss, x)

    np.testing.assert_allclose(np.asarray(step(x)), np.asarray(plain(x)), rtol=1e-5, atol=1e-6)


def test_active_only_when_training_on_tensorflow():
    assert fused.active(True)
    assert not fused.active(False) and not fused.active(None)
