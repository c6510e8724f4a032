import numpy as np

from keras_vit.layers import StochasticDepth
from tests.layers.helpers import assert_config_round_trip


def test_identity_at_inference(rng):
    x = rng.normal(size=(8, 3, 4)).astype("float32")
    np.testing.assert_array_equal(np.asarray(StochasticDepth(0.5)(x, training=False)), x)


def test_drops_whole_examples_at_the_rate_and_rescales_the_rest():
    layer = StochasticDepth(0.25, seed=1)
    x = np.ones((4000, 3, 2), "float32")
    out = np.asarray(layer(x, training=True))
    per_example = out.reshape(4000, -1)
    # Each example is all zeros or all 1 / (1 - rate).
    assert np.all((per_example == 0).all(axis=1) | np.isclose(per_example, 1 / 0.75).all(axis=1))
    dropped = (per_example == 0).all(axis=1).mean()
    assert abs(dropped - 0.25) < 0.03
    assert abs(out.mean() - 1.0) < 0.05  # expectation kept


def test_config_round_trip(rng):
    assert_config_round_trip(StochasticDepth(0.1, seed=3), rng.normal(size=(2, 3, 4)).astype("float32"))
