import numpy as np
import pytest

from keras_vit.layers import PositionEmbedding2D
from tests.layers.helpers import assert_config_round_trip


def _randomise(layer, rng):
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()])


@pytest.mark.parametrize("prefix", [0, 1])
def test_concat_of_column_and_row_tables(rng, prefix):
    rows, cols, width = 2, 3, 8
    layer = PositionEmbedding2D((rows, cols), num_prefix_tokens=prefix)
    tokens = rng.normal(size=(2, prefix + rows * cols, width)).astype("float32")
    layer.build(tokens.shape)
    _randomise(layer, rng)
    column, row = np.asarray(layer.column_embedding), np.asarray(layer.row_embedding)
    assert column.shape == (cols, width // 2) and row.shape == (rows, width // 2)
    expected = tokens.copy()
    for r in range(rows):
        for c in range(cols):  # row-major patches: X (column) then Y (row), D/2 each
            expected[:, prefix + r * cols + c] += np.concatenate([column[c], row[r]])
    if prefix:
        assert layer.prefix_embedding.shape == (1, width)
        expected[:, 0] += np.asarray(layer.prefix_embedding)[0]
    else:
        assert layer.prefix_embedding is None
    np.testing.assert_allclose(np.asarray(layer(tokens)), expected, rtol=1e-6, atol=1e-6)


def test_initialised_like_the_1d_table():
    layer = PositionEmbedding2D(16, num_prefix_tokens=1)
    layer.build((None, 1 + 256, 64))
    assert 0.015 < np.asarray(layer.row_embedding).std() < 0.025


def test_wrong_token_count_or_odd_width():
    with pytest.raises(ValueError, match=r"1 prefix token\(s\) and a 2x3 grid \(7 tokens\) but got 6"):
        PositionEmbedding2D((2, 3), num_prefix_tokens=1).build((None, 6, 8))
    with pytest.raises(ValueError, match="odd"):
        PositionEmbedding2D((2, 3)).build((None, 6, 7))


def test_config_round_trip(rng):
    assert_config_round_trip(PositionEmbedding2D((2, 3), num_prefix_tokens=1),
                             rng.normal(size=(2, 7, 8)).astype("float32"))
