"""Resizing position weights for another image size (fine-tuning at a higher
resolution), through the package's one resize (keras_vit.layers.interpolation):
linear with the corner samples aligned (the semantics of
scipy.ndimage.zoom(order=1), what the official loader does to the 1-D table),
or a family's torch bicubic rule for the 1-D table where its config says so
(ViTConfig.position_interpolation). The rule of each ViTConfig.position_embedding:

    learned_1d  the (1, prefix + R*C, D) table: the class-token slot is kept,
                the grid part is resized over rows and columns (official);
    learned_2d  the row table (R, D/2) along R, the column table (C, D/2)
                along C; the class token's vector is kept;
    sincos_2d   no weights: the model computes the table for its own grid;
    relative    each head's (2R-1, 2C-1) offset table along both offset axes
                (offset 0 stays at the centre; the class-token biases are kept);
    none        nothing.
"""

from __future__ import annotations

import math

import numpy as np

from keras_vit.errors import UserError
from keras_vit.layers.interpolation import resize_along, resize_grid
from keras_vit.weights.layout import BLOCK_PARTS, POSEMB_ROOT


def resize_position_embedding(posemb, new_grid, num_prefix_tokens=1, old_grid=None, method="linear") -> np.ndarray:
    """Resizes a (1, prefix + rows * cols, D) position embedding to `new_grid`.

    Args:
        posemb: the old table, (1, N, D).
        new_grid: (rows, cols) of the new patch grid, or an int for a square.
        num_prefix_tokens: leading non-grid tokens kept as they are (1 for the
            class token of classifier="token", 0 for "gap").
        old_grid: (rows, cols) of the old grid; by default the old grid is
            taken to be square, as in every official checkpoint.
        method: "linear" (this module's rule, the official loader's) or a
            family's torch "bicubic" / "bicubic_antialias"
            (ViTConfig.position_interpolation; keras_vit.layers.interpolation).

    Returns a float array of shape (1, prefix + new_rows * new_cols, D) and the
    dtype of `posemb`.
    """
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise UserError(f"A position embedding has shape (1, tokens, width), got {posemb.shape}.")
    if isinstance(new_grid, int):
        new_grid = (new_grid, new_grid)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if old_grid is None:
        side = math.isqrt(grid.shape[0])
        if side * side != grid.shape[0]:
            raise UserError(
                f"The position embedding has {grid.shape[0]} grid tokens (after {num_prefix_tokens} "
                f"prefix token(s)), which is not a square grid: pass old_grid=(rows, cols)."
            )
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != grid.shape[0]:
        raise UserError(f"old_grid {old_grid} does not hold the {grid.shape[0]} grid tokens of the table.")
    grid = resize_grid(grid.reshape(old_grid[0], old_grid[1], -1), tuple(new_grid), method)
    grid = grid.reshape(1, new_grid[0] * new_grid[1], -1)
    return np.concatenate([prefix, grid], axis=1)


# Official-layout key suffixes of the resizable position weights (the key table's).
_POSITIONS = POSEMB_ROOT.rsplit("/", 1)[-1]
POSEMB_1D_SUFFIX = f"{_POSITIONS}/pos_embedding"
ROW_SUFFIX = f"{_POSITIONS}/row_embedding"
COLUMN_SUFFIX = f"{_POSITIONS}/column_embedding"
RELATIVE_SUFFIX = BLOCK_PARTS["relative_bias"].rsplit("/", 1)[-1] + "/relative_bias"


def resize_relative_position_bias(table, new_grid) -> np.ndarray:
    """Resizes a (heads, 2R-1, 2C-1) relative-position bias table to the offsets of
    a `new_grid` (rows, cols) (an int for a square): (heads, 2R'-1, 2C'-1)."""
    table = np.asarray(table)
    if table.ndim != 3 or table.shape[1] % 2 == 0 or table.shape[2] % 2 == 0:
        raise UserError(f"A relative-position bias table has shape (heads, 2*rows-1, 2*cols-1), got {table.shape}.")
    rows, cols = (new_grid, new_grid) if isinstance(new_grid, int) else new_grid
    return np.moveaxis(resize_grid(np.moveaxis(table, 0, -1), (2 * rows - 1, 2 * cols - 1), "linear"), -1, 0)


def resize_position_params(params, shapes, grid, num_prefix_tokens, old_grid=None, method="linear"):
    """Applies the rule of the module docstring to every position weight in
    `params` ({official-layout key: array}) whose shape differs from the model's
    (`shapes`: {key: shape}) on its grid axes only, for a model with patch grid
    `grid` (rows, cols). `old_grid`: the grid of a 1-D table, when known (else
    taken to be square). `method`: the 1-D table's interpolation (ViTConfig.position_interpolation).
    Returns (new params, [what was resized, for the log])."""
    params = dict(params)
    resized = []
    rows, cols = grid
    for key, want in shapes.items():
        have = params.get(key)
        want = tuple(want)
        if have is None or have.ndim != len(want):
            continue
        if key.endswith(POSEMB_1D_SUFFIX) and have.shape[2] == want[2] and _needs_1d_resize(
                have, grid, num_prefix_tokens, old_grid):
            params[key] = resize_position_embedding(have, grid, num_prefix_tokens=num_prefix_tokens,
                                                    old_grid=old_grid, method=method)
            resized.append(f"the position embedding from {have.shape[1]} to {want[1]} tokens (grid {tuple(grid)})")
            continue
        if tuple(have.shape) == want:
            continue
        if key.endswith((ROW_SUFFIX, COLUMN_SUFFIX)) and have.shape[1] == want[1]:
            size = rows if key.endswith(ROW_SUFFIX) else cols
            params[key] = resize_along(have, size, axis=0)
        elif key.endswith(RELATIVE_SUFFIX) and have.shape[0] == want[0]:
            params[key] = resize_relative_position_bias(have, grid)
        else:
            continue
        resized.append(f"{key} from {tuple(have.shape)} to {tuple(params[key].shape)} (grid {tuple(grid)})")
    return params, resized


def _needs_1d_resize(posemb, grid, num_prefix_tokens, old_grid=None) -> bool:
    """Whether a 1-D table (for `old_grid`, else taken to be square as above) is for another
    grid than `grid`: by the grid, not the token count, since 4x4 and 8x2 hold as many tokens."""
    if old_grid is not None:
        return tuple(old_grid) != tuple(grid)
    tokens = posemb.shape[1] - num_prefix_tokens
    side = math.isqrt(tokens)
    if side * side != tokens:
        return tokens != grid[0] * grid[1]  # not square: resize_position_embedding names the problem
    return (side, side) != tuple(grid)
