"""Interpolation of position-embedding grids, as each model family's own code does it.

A checkpoint trained at one patch grid is used at another by resampling its
position table, and the numbers a model then gives depend on exactly how: each
family resizes with its own code's interpolation. The paper's official loader
resamples linearly with the corner samples aligned (keras_vit.weights.resize);
DeiT, CLIP, SigLIP and DINOv2 call torch.nn.functional.interpolate(...,
mode="bicubic", align_corners=False); DINOv2 with registers adds antialias=True.
Matching a family's reference outputs therefore needs torch's two bicubic
rules, reproduced here from their definitions (not by calling torch):

    linear             src = dst * (old - 1) / (new - 1), two taps (new 1 reads sample 0);
    bicubic            torch's upsample_bicubic2d: Keys cubic a=-0.75 at
                       src = (dst + 0.5) * old / new - 0.5, taps floor(src)-1 .. floor(src)+2
                       with indices clamped to the border (src itself is not clamped);
    bicubic_antialias  torch's _upsample_bicubic2d_aa (Pillow's resampling): cubic a=-0.5
                       stretched by max(old / new, 1) around (dst + 0.5) * old / new, its
                       window cut to the grid and the weights normalised to sum 1;
    bilinear_antialias torch's bilinear with antialias=True (SigLIP2's per-image table): the
                       triangle 1 - |x| stretched the same way, cut and normalised the same way.

Every rule is separable, so each axis is a (new, old) matrix and a grid is
resized by two matrix products. The formulas are written once against an
array namespace (numpy or keras.ops): numpy in float64 for weights converted at
load time (keras_vit.weights.resize), keras.ops in float32 for models that
resize in the graph at a grid known only at run time (ViT(dynamic_image_size=True)).
This is the package's one resize: every position table (1-D grid, 2-D row and
column tables, relative-offset tables) goes through `resize_along` or `resize_grid`
at load time and their `_ops` forms in the graph, so the two cannot drift apart.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_vit.config import POSITION_INTERPOLATIONS
from keras_vit.errors import UserError

METHODS = POSITION_INTERPOLATIONS  # the position-table rules (ViTConfig.position_interpolation)

# Keys' cubic-convolution parameter: torch's bicubic uses -0.75 (as OpenCV),
# its antialiased path -0.5 (as Pillow).
_A_BICUBIC = -0.75
_A_ANTIALIAS = -0.5


def _cast(xp, x, dtype):
    return np.asarray(x, dtype=dtype) if xp is np else ops.cast(x, dtype)


def _cubic(xp, x, a):
    """Keys' cubic kernel at distance `x` (zero from |x| = 2 on)."""
    x = xp.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return xp.where(x < 1, near, xp.where(x < 2, far, 0.0))


def _one_hot(xp, index, old_size, dtype):
    """(new, old): 1 where column j is `index[i]` (the dense form of a gather)."""
    columns = xp.arange(old_size, dtype=dtype)[None, :]
    return _cast(xp, xp.equal(index[:, None], columns), dtype)


def _two_taps(xp, src, old_size, dtype):
    """(new, old): each output sample the linear mix of the two input samples around `src`."""
    src = xp.clip(src, 0, old_size - 1)
    low = xp.floor(src)
    high = xp.minimum(low + 1, old_size - 1)
    frac = (src - low)[:, None]
    return _one_hot(xp, low, old_size, dtype) * (1 - frac) + _one_hot(xp, high, old_size, dtype) * frac


def _linear(xp, old_size, new_size, dtype):
    # Corner-aligned: sample i sits at i * (old - 1) / (new - 1); a 1-sample axis reads sample 0.
    step = _cast(xp, old_size - 1, dtype) / _cast(xp, xp.maximum(new_size - 1, 1), dtype)
    return _two_taps(xp, xp.arange(new_size, dtype=dtype) * step, old_size, dtype)


def _bilinear(xp, old_size, new_size, dtype):
    # tf.image.resize's "bilinear" (half-pixel centres, no antialiasing), clamped to the border.
    scale = old_size / _cast(xp, new_size, dtype)
    return _two_taps(xp, (xp.arange(new_size, dtype=dtype) + 0.5) * scale - 0.5, old_size, dtype)


def _bicubic(xp, old_size, new_size, dtype):
    scale = old_size / _cast(xp, new_size, dtype)
    # Half-pixel centres. torch clamps neither src (it may be < 0 when downsampling to few
    # samples) nor the taps' weights: only the tap indices, so clipped taps pile up on the border.
    src = (xp.arange(new_size, dtype=dtype) + 0.5) * scale - 0.5
    first = xp.floor(src) - 1
    matrix = 0.0
    for k in range(4):
        tap = first + k
        weight = _cubic(xp, src - tap, _A_BICUBIC)[:, None]
        matrix = matrix + _one_hot(xp, xp.clip(tap, 0, old_size - 1), old_size, dtype) * weight
    return matrix


def _bicubic_antialias(xp, old_size, new_size, dtype):
    scale = old_size / _cast(xp, new_size, dtype)
    # Downsampling widens the kernel by the scale so that every input sample
    # contributes (the antialiasing); upsampling keeps it at 2 samples each side.
    stretch = xp.maximum(scale, 1.0)
    support = 2.0 * stretch
    centre = ((xp.arange(new_size, dtype=dtype) + 0.5) * scale)[:, None]
    j = xp.arange(old_size, dtype=dtype)[None, :]
    # torch's window: int(centre -/+ support + 0.5) cut to the grid (truncation and floor
    # agree here, the lower end being clamped at 0 anyway).
    start = xp.maximum(xp.floor(centre - support + 0.5), 0.0)
    stop = xp.minimum(xp.floor(centre + support + 0.5), old_size)
    inside = xp.logical_and(j >= start, j < stop)
    weights = xp.where(inside, _cubic(xp, (j - centre + 0.5) / stretch, _A_ANTIALIAS), 0.0)
    total = xp.sum(weights, axis=1, keepdims=True)
    # The window holds the kernel's peak, so the total is never 0; the guard only keeps a 0/0 out.
    return weights / xp.where(xp.equal(total, 0), 1.0, total)


def triangle_weights(xp, old_size, positions, new_size, dtype):
    """(..., n, old): torch's antialiased bilinear weights of output samples `positions`
    (..., n) on an axis of `new_size` samples (broadcast against positions[..., :1]).
    Batched: SigLIP2 resizes one table to each image's own grid (keras_vit.model.naflex)."""
    scale = old_size / _cast(xp, new_size, dtype)
    stretch = xp.maximum(scale, 1.0)
    centre = ((_cast(xp, positions, dtype) + 0.5) * scale)[..., None]
    j = xp.arange(old_size, dtype=dtype)
    # Zero beyond one stretched sample of the centre, so the window needs no cutting of its own.
    weights = xp.maximum(1.0 - xp.abs(j + 0.5 - centre) / stretch[..., None], 0.0)
    return weights / xp.sum(weights, axis=-1, keepdims=True)


def _bilinear_antialias(xp, old_size, new_size, dtype):
    return triangle_weights(xp, old_size, xp.arange(new_size, dtype=dtype), new_size, dtype)


_BUILDERS = {"linear": _linear, "bicubic": _bicubic, "bicubic_antialias": _bicubic_antialias,
             "bilinear_antialias": _bilinear_antialias,
             # not a position rule (METHODS): FlexiViT's patch-kernel resize (weights/patch_resize.py)
             "bilinear": _bilinear}


def _check(old_size, method):
    if method not in _BUILDERS:
        raise UserError(f"Unknown interpolation {method!r}: one of {', '.join(_BUILDERS)}.")
    if old_size < 1:
        raise UserError(f"Cannot interpolate from an axis of {old_size} samples.")


def interpolation_matrix(old_size: int, new_size: int, method: str) -> np.ndarray:
    """The float64 (new_size, old_size) matrix taking `old_size` samples to
    `new_size` by `method` (one of METHODS, or "bilinear"); the identity when the sizes agree."""
    _check(old_size, method)
    if new_size < 1:
        raise UserError(f"Cannot interpolate to an axis of {new_size} samples.")
    return _BUILDERS[method](np, int(old_size), int(new_size), "float64")


def _along(x, new_size, axis, method):
    """float64 `x` resampled along `axis` (a matrix product; the axis keeps its place)."""
    if x.shape[axis] == new_size:
        return x
    out = np.tensordot(interpolation_matrix(x.shape[axis], new_size, method), x, axes=([1], [axis]))
    return np.moveaxis(out, 0, axis)


def resize_along(x, new_size: int, axis: int, method: str = "linear") -> np.ndarray:
    """`x` resampled to `new_size` samples along `axis` by `method` (a 2-D
    position model's row or column table, a relative-offset table's axis),
    computed in float64 and returned in x's dtype; `x` itself at its own size."""
    x = np.asarray(x)
    if x.shape[axis] == new_size:
        return x
    return _along(x.astype(np.float64), int(new_size), axis, method).astype(x.dtype)


def resize_grid(grid, new_grid, method: str) -> np.ndarray:
    """A (rows, cols, D) grid resampled to `new_grid` (new_rows, new_cols) by
    `method`, computed in float64 and returned in the grid's dtype."""
    grid = np.asarray(grid)
    if grid.ndim != 3:
        raise UserError(f"A position grid has shape (rows, cols, width), got {grid.shape}.")
    out = _along(_along(grid.astype(np.float64), int(new_grid[0]), 0, method), int(new_grid[1]), 1, method)
    return out.astype(grid.dtype)


def _matrix_ops(old_size, new_size, method):
    """The float32 (new, old) matrix as a tensor. A Python-int size stays static
    (JAX's jit needs arange of a Python int): built in numpy. A run-time size
    (a scalar tensor, e.g. under tf.function with unknown H, W): built in ops."""
    _check(old_size, method)
    if isinstance(new_size, (int, np.integer)):
        return ops.convert_to_tensor(interpolation_matrix(old_size, int(new_size), method), "float32")
    return _BUILDERS[method](ops, int(old_size), ops.cast(new_size, "int32"), "float32")


def _along_ops(x, new_size, axis, method):
    """float32 tensor `x` resampled along `axis`; at its own (static) size, `x` itself."""
    if isinstance(new_size, (int, np.integer)) and int(new_size) == x.shape[axis]:
        return x
    out = ops.tensordot(_matrix_ops(x.shape[axis], new_size, method), x, axes=([1], [axis]))
    return ops.moveaxis(out, 0, axis)


def resize_along_ops(x, new_size, axis: int, method: str = "linear"):
    """resize_along in keras.ops, inside a model on any backend: the old size
    (x's `axis`) is static, `new_size` a Python int or a scalar int tensor.
    Computed in float32, returned in x's dtype."""
    x = ops.convert_to_tensor(x)
    return ops.cast(_along_ops(ops.cast(x, "float32"), new_size, axis, method), x.dtype)


def resize_grid_ops(grid, new_rows, new_cols, method: str):
    """resize_grid in keras.ops, for use inside a model on any backend: `grid`
    (rows, cols, D) has a static shape, `new_rows` / `new_cols` are Python ints
    or scalar int tensors. Computed in float32, returned in the grid's dtype."""
    grid = ops.convert_to_tensor(grid)
    out = _along_ops(_along_ops(ops.cast(grid, "float32"), new_rows, 0, method), new_cols, 1, method)
    return ops.cast(out, grid.dtype)
