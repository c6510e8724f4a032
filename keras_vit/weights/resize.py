"""Resizing the position embedding for another image size (fine-tuning at a
higher resolution), as the official loader does: the class-token slot is
kept, the grid part is resized by linear interpolation with the corner
samples aligned (the semantics of scipy.ndimage.zoom(order=1))."""

from __future__ import annotations

import math

import numpy as np


def _linear_resize_axis(x: np.ndarray, new_size: int, axis: int) -> np.ndarray:
    old_size = x.shape[axis]
    if new_size == old_size:
        return x
    # Output sample i sits at input coordinate i * (old - 1) / (new - 1), so the
    # first and last samples coincide with the old grid's (scipy's grid_mode=False).
    if new_size == 1:
        coords = np.zeros(1)
    else:
        coords = np.arange(new_size) * ((old_size - 1) / (new_size - 1))
    coords = np.clip(coords, 0, old_size - 1)
    lo = np.floor(coords).astype(int)
    hi = np.minimum(lo + 1, old_size - 1)
    frac = coords - lo
    shape = [1] * x.ndim
    shape[axis] = new_size
    frac = frac.reshape(shape)
    return np.take(x, lo, axis=axis) * (1 - frac) + np.take(x, hi, axis=axis) * frac


def resize_position_embedding(posemb, new_grid, num_prefix_tokens=1, old_grid=None) -> np.ndarray:
    """Resizes a (1, prefix + rows * cols, D) position embedding to `new_grid`.

    Args:
        posemb: the old table, (1, N, D).
        new_grid: (rows, cols) of the new patch grid, or an int for a square.
        num_prefix_tokens: leading non-grid tokens kept as they are (1 for the
            class token of classifier="token", 0 for "gap").
        old_grid: (rows, cols) of the old grid; by default the old grid is
            taken to be square, as in every official checkpoint.

    Returns a float array of shape (1, prefix + new_rows * new_cols, D) and the
    dtype of `posemb`.
    """
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"A position embedding has shape (1, tokens, width), got {posemb.shape}.")
    if isinstance(new_grid, int):
        new_grid = (new_grid, new_grid)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if old_grid is None:
        side = math.isqrt(grid.shape[0])
        if side * side != grid.shape[0]:
            raise ValueError(
                f"The position embedding has {grid.shape[0]} grid tokens (after {num_prefix_tokens} "
                f"prefix token(s)), which is not a square grid: pass old_grid=(rows, cols)."
            )
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != grid.shape[0]:
        raise ValueError(f"old_grid {old_grid} does not hold the {grid.shape[0]} grid tokens of the table.")
    grid = grid.reshape(old_grid[0], old_grid[1], -1).astype(np.float64)
    grid = _linear_resize_axis(grid, new_grid[0], axis=0)
    grid = _linear_resize_axis(grid, new_grid[1], axis=1)
    grid = grid.reshape(1, new_grid[0] * new_grid[1], -1).astype(posemb.dtype)
    return np.concatenate([prefix, grid], axis=1)
