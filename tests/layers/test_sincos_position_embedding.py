import numpy as np
import pytest

from keras_vit.layers import SinCosPositionEmbedding2D, sincos_2d_table
from tests.layers.helpers import assert_config_round_trip


def mae_1d(width, positions):
    """MAE's get_1d_sincos_pos_embed_from_grid, written from its formula."""
    omega = 1.0 / 10000 ** (np.arange(width // 2, dtype=np.float64) / (width / 2.0))
    angles = np.outer(positions.reshape(-1), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def mae_2d(width, rows, cols):
    """MAE's get_2d_sincos_pos_embed: meshgrid(w, h) puts the column index in the first
    array, which fills the first half of the width; the row index fills the second."""
    grid = np.meshgrid(np.arange(cols, dtype=np.float64), np.arange(rows, dtype=np.float64))
    return np.concatenate([mae_1d(width // 2, grid[0]), mae_1d(width // 2, grid[1])], axis=1)


@pytest.mark.parametrize("grid", [(4, 4), (3, 5)])
def test_table_is_maes(grid):
    np.testing.assert_allclose(sincos_2d_table(grid, 16), mae_2d(16, *grid), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("prefix", [0, 1])
def test_adds_the_table_and_zeros_for_the_class_token(rng, prefix):
    layer = SinCosPositionEmbedding2D((3, 5), num_prefix_tokens=prefix)
    tokens = rng.normal(size=(2, prefix + 15, 16)).astype("float32")
    out = np.asarray(layer(tokens))
    assert layer.weights == []  # fixed: nothing learned, nothing saved
    np.testing.assert_allclose(out[:, :prefix], tokens[:, :prefix], rtol=1e-6)
    np.testing.assert_allclose(out[:, prefix:], tokens[:, prefix:] + mae_2d(16, 3, 5), rtol=1e-5, atol=1e-6)


def test_a_larger_grid_extends_the_table():
    # Grid indices, not fractions: the 2x2 table is the top-left corner of the 4x4 one.
    small, large = sincos_2d_table((2, 2), 8), sincos_2d_table((4, 4), 8).reshape(4, 4, 8)
    np.testing.assert_allclose(small.reshape(2, 2, 8), large[:2, :2], rtol=1e-6)


def test_width_must_split_in_four():
    with pytest.raises(ValueError, match="not divisible by 4"):
        SinCosPositionEmbedding2D((2, 2)).build((None, 4, 6))


def test_config_round_trip(rng):
    assert_config_round_trip(SinCosPositionEmbedding2D((2, 3), num_prefix_tokens=1),
                             rng.normal(size=(2, 7, 8)).astype("float32"))
