import numpy as np
import pytest

from keras_vit.layers import PositionEmbedding
from tests.layers.helpers import assert_config_round_trip


def test_adds_the_table(rng):
    layer = PositionEmbedding()
    tokens = rng.normal(size=(2, 5, 4)).astype("float32")
    out = np.asarray(layer(tokens))
    table = layer.get_weights()[0]
    assert table.shape == (1, 5, 4)
    assert 0.005 < table.std() < 0.05  # normal(stddev=0.02), as the official init
    np.testing.assert_allclose(out, tokens + table, rtol=1e-6)


def test_needs_a_known_length():
    with pytest.raises(ValueError, match="known sequence length"):
        PositionEmbedding().build((None, None, 4))


def test_config_round_trip(rng):
    assert_config_round_trip(PositionEmbedding(), rng.normal(size=(2, 5, 4)).astype("float32"))
