"""keras_vit.layers.interpolation: the bicubic rules equal torch's
F.interpolate(mode="bicubic", align_corners=False), with and without
antialias, up, down, non-square and at 1 sample; "linear" equals the
official loader's rule (scipy.ndimage.zoom, order 1, corners aligned), along one axis too; equal sizes give the identity; the keras.ops version
equals the numpy one for static sizes and for sizes known only at run time."""

import keras
import numpy as np
import pytest

from keras_vit.errors import UserError
from keras_vit.layers.interpolation import METHODS, interpolation_matrix, resize_along, resize_grid, resize_grid_ops

torch = pytest.importorskip("torch")

PAIRS = [  # (old grid, new grid)
    ((4, 4), (7, 5)), ((16, 16), (37, 37)), ((37, 37), (16, 16)), ((5, 5), (1, 1)), ((1, 1), (3, 3)),
    ((3, 3), (3, 3)), ((14, 14), (16, 16)), ((16, 16), (14, 14)), ((24, 24), (7, 11)), ((2, 9), (5, 2)),
]
TORCH_METHODS = {"bicubic": False, "bicubic_antialias": True}  # method: torch's antialias


def grid_of(shape, seed=0):
    return np.random.default_rng(seed).normal(size=(*shape, 8)).astype("float32")


def torch_resize(grid, new_grid, antialias):
    x = torch.from_numpy(grid).permute(2, 0, 1)[None]  # (rows, cols, D) -> NCHW
    out = torch.nn.functional.interpolate(x, size=tuple(new_grid), mode="bicubic", align_corners=False,
                                          antialias=antialias)
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("method", sorted(TORCH_METHODS))
@pytest.mark.parametrize("old, new", PAIRS)
def test_resize_grid_equals_torch(method, old, new):
    grid = grid_of(old)
    got = resize_grid(grid, new, method)
    assert got.shape == (*new, 8) and got.dtype == np.float32
    np.testing.assert_allclose(got, torch_resize(grid, new, TORCH_METHODS[method]), atol=1e-5)


@pytest.mark.parametrize("method", sorted(TORCH_METHODS))
def test_matrices_equal_torch_for_every_small_size(method):
    # Each column of the matrix is torch's response to a unit sample (float64 on both sides).
    for old in range(1, 13):
        eye = torch.eye(old, dtype=torch.float64)[None, None]
        for new in range(1, 13):
            ref = torch.nn.functional.interpolate(eye, size=(new, old), mode="bicubic", align_corners=False,
                                                  antialias=TORCH_METHODS[method])[0, 0].numpy()
            np.testing.assert_allclose(interpolation_matrix(old, new, method), ref, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_equal_sizes_give_the_identity(method):
    for size in (1, 2, 7, 16, 37):
        matrix = interpolation_matrix(size, size, method)
        assert matrix.dtype == np.float64 and np.array_equal(matrix, np.eye(size))


@pytest.mark.parametrize("old, new", PAIRS)
def test_linear_is_the_official_loaders_rule(old, new):
    from scipy import ndimage

    grid = grid_of(old).astype(np.float64)
    # scipy's order-1 zoom without grid_mode: output sample i at input i * (old - 1) / (new - 1).
    want = ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1, grid_mode=False)
    assert want.shape == (*new, 8)
    np.testing.assert_allclose(resize_grid(grid, new, "linear"), want, atol=1e-12)
    # One axis at a time (a 2-D model's row or column table), in the table's dtype.
    rows = resize_along(grid_of(old)[:, 0], new[0], 0)
    assert rows.dtype == np.float32
    np.testing.assert_allclose(rows, ndimage.zoom(grid[:, 0], (new[0] / old[0], 1), order=1, grid_mode=False),
                               atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_ops_with_static_sizes_equals_numpy(method):
    for old, new in PAIRS:
        grid = grid_of(old)
        got = keras.ops.convert_to_numpy(resize_grid_ops(grid, new[0], new[1], method))
        np.testing.assert_allclose(got, resize_grid(grid, new, method), atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_ops_with_run_time_sizes_equals_numpy(method):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a graph with unknown sizes is traced with tf.function")
    import tensorflow as tf

    grid = grid_of((16, 16))
    size = tf.TensorSpec((), tf.int32)
    resize = tf.function(lambda rows, cols: resize_grid_ops(grid, rows, cols, method), input_signature=[size, size])
    for new in [(16, 16), (37, 37), (7, 5), (1, 1), (3, 20)]:
        got = resize(tf.constant(new[0]), tf.constant(new[1])).numpy()
        np.testing.assert_allclose(got, resize_grid(grid, new, method), atol=1e-5)


def test_bad_arguments():
    with pytest.raises(UserError, match="Unknown interpolation"):
        interpolation_matrix(4, 5, "nearest")
    with pytest.raises(UserError, match="0 samples"):
        interpolation_matrix(4, 0, "bicubic")
    with pytest.raises(UserError, match="rows, cols, width"):
        resize_grid(np.zeros((4, 4)), (5, 5), "bicubic")
