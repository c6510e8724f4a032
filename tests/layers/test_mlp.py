import numpy as np

from keras_vit.layers import MlpBlock
from tests.layers import reference
from tests.layers.helpers import assert_config_round_trip


def test_tanh_gelu_mlp_matches_reference(rng):
    layer = MlpBlock(mlp_dim=24)
    x = rng.normal(size=(2, 5, 8)).astype("float32") * 2
    out = np.asarray(layer(x))
    w0, b0 = np.asarray(layer.dense_0.kernel), np.asarray(layer.dense_0.bias)
    w1, b1 = np.asarray(layer.dense_1.kernel), np.asarray(layer.dense_1.bias)
    np.testing.assert_allclose(out, reference.mlp(x, w0, b0, w1, b1), rtol=1e-5, atol=1e-5)
    # The exact (erf) GELU differs by more than that: the tanh form is what is used.
    from scipy.special import erf
    exact = (lambda h: 0.5 * h * (1 + erf(h / np.sqrt(2))))(x @ w0 + b0) @ w1 + b1
    assert np.abs(out - exact).max() > 1e-4


def test_official_initialisation():
    layer = MlpBlock(mlp_dim=64)
    layer.build((None, 4, 32))
    bias = np.asarray(layer.dense_0.bias)
    assert 0 < np.abs(bias).max() < 1e-4  # normal(stddev=1e-6)
    limit = np.sqrt(6 / (32 + 64))  # Xavier uniform
    kernel = np.asarray(layer.dense_0.kernel)
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.9 * limit


def test_config_round_trip(rng):
    assert_config_round_trip(MlpBlock(16, dropout_rate=0.1), rng.normal(size=(2, 3, 8)).astype("float32"))


def test_exact_gelu_when_asked(rng):
    from scipy.special import erf

    layer = MlpBlock(mlp_dim=24, gelu_approximate=False)
    x = rng.normal(size=(2, 5, 8)).astype("float32") * 2
    out = np.asarray(layer(x))
    w0, b0 = np.asarray(layer.dense_0.kernel), np.asarray(layer.dense_0.bias)
    w1, b1 = np.asarray(layer.dense_1.kernel), np.asarray(layer.dense_1.bias)
    h = x @ w0 + b0
    np.testing.assert_allclose(out, (0.5 * h * (1 + erf(h / np.sqrt(2)))) @ w1 + b1, rtol=1e-5, atol=1e-5)
    assert_config_round_trip(layer, x)
    assert layer.get_config()["gelu_approximate"] is False
