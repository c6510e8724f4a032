import numpy as np

from keras_vit.layers import ClassToken
from tests.layers.helpers import assert_config_round_trip


def test_prepends_the_same_learned_token_to_every_example(rng):
    layer = ClassToken()
    tokens = rng.normal(size=(3, 5, 4)).astype("float32")
    layer.build(tokens.shape)
    cls = rng.normal(size=(1, 1, 4)).astype("float32")
    layer.set_weights([cls])
    out = np.asarray(layer(tokens))
    assert out.shape == (3, 6, 4)
    np.testing.assert_array_equal(out[:, 1:], tokens)
    np.testing.assert_array_equal(out[:, 0], np.broadcast_to(cls[0], (3, 4)))


def test_starts_at_zero(rng):
    layer = ClassToken()
    layer.build((1, 5, 4))
    assert not np.any(layer.get_weights()[0])


def test_config_round_trip(rng):
    assert_config_round_trip(ClassToken(), rng.normal(size=(2, 5, 4)).astype("float32"))
