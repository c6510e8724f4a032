"""NaFlex (SigLIP2): every image at its own aspect ratio and patch count, up to a maximum.

Three rules, as transformers' Siglip2 code and image processor apply them (written
here from their definitions):

- **size** (`naflex_size`): an image of h x w pixels is resized to the largest
  scale s (found by bisection to 1e-5) at which ceil(h s / p) * ceil(w s / p)
  patches fit in `max_patches`, each side rounded up to whole patches and at
  least one patch. The budget is the processor's `max_num_patches`
  (`patch_budget`: by default the table's G x G, any other without a rebuild);
- **positions**: the learned G x G table is resized to each image's own grid by
  torch's antialiased bilinear (position_interpolation="bilinear_antialias");
  a model built with dynamic_image_size=True does this for the grid of
  whatever it is called on;
- **padding** (`pad_batch`, `call_padded`): images of different grids share a
  batch padded at the bottom and right; attention and pooling leave the
  padding's tokens out, so each row equals its image alone.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
from keras import ops

from keras_vit.errors import UserError
from keras_vit.utils.console import either
from keras_vit.layers.interpolation import triangle_weights

# The bisection of transformers' get_image_size_for_max_num_patches: its bounds and tolerance.
_SCALE_RANGE, _TOLERANCE = (1e-6, 100.0), 1e-5


def _bisection_steps() -> int:
    """How many halvings take the bracket under the tolerance: always the same count (24),
    whatever the image, so the search unrolls into a fixed graph (the SavedModel's)."""
    low, high, steps = *_SCALE_RANGE, 0
    while high - low >= _TOLERANCE:
        high, steps = (low + high) / 2, steps + 1
    return steps


_STEPS = _bisection_steps()


def bisect_size(height, width, patch_size, max_patches, ceil, maximum, select, number=float):
    """naflex_size's search on any numbers: Python floats, or float64 tensors with the
    tensor library's `ceil`, `maximum`, `select(condition, a, b)` and `number` (a constant
    of its float64) (keras_vit.export's bytes signature). Returns the sides in pixels."""
    patch_size, max_patches = number(patch_size), number(max_patches)

    def side(size, scale):
        return maximum(ceil(size * scale / patch_size) * patch_size, patch_size)

    low, high = (number(bound) for bound in _SCALE_RANGE)
    for _ in range(_STEPS):
        scale = (low + high) / 2
        fits = (side(height, scale) / patch_size) * (side(width, scale) / patch_size) <= max_patches
        low, high = select(fits, scale, low), select(fits, high, scale)
    return side(height, low), side(width, low)


def naflex_size(height: int, width: int, patch_size: int, max_patches: int) -> Tuple[int, int]:
    """The (height, width) in pixels, multiples of `patch_size`, that an image of
    height x width is resized to so that its grid holds at most `max_patches`
    patches at its own aspect ratio (SigLIP2's processor's rule)."""
    if min(height, width, patch_size, max_patches) < 1:
        raise UserError(f"naflex_size needs positive sizes, got {height}x{width} pixels, patch {patch_size}, "
                        f"max_patches {max_patches}.")
    rows, cols = bisect_size(height, width, patch_size, max_patches, math.ceil, max,
                             lambda condition, a, b: a if condition else b)
    return int(rows), int(cols)


def is_naflex(model) -> bool:
    """Whether `model` takes each image at its own grid as SigLIP2's NaFlex does: a dynamic
    model whose learned table each grid resizes by the antialiased bilinear rule."""
    config = model.config
    return bool(getattr(model, "dynamic_image_size", False) and config.position_embedding == "learned_1d"
                and config.position_interpolation == "bilinear_antialias")


def max_patches(model) -> int:
    """The most patches a NaFlex model takes per image by default: its table's (the checkpoint's num_patches)."""
    rows, cols = model.grid_size
    return rows * cols


def patch_budget(model, max_num_patches=None) -> int:
    """The most patches each image is read at: `max_num_patches` (transformers' processor
    setting, Siglip2ImageProcessor(max_num_patches=...): 256 to 1024 in use), or by default
    the table's (`max_patches`). The table itself is never rebuilt: each image's grid resizes
    it once, from its own size (positions_per_image, the model's dynamic position embedding),
    as transformers does, so one checkpoint serves any budget."""
    if max_num_patches is None:
        return max_patches(model)
    flag = either("--max-num-patches", "max_num_patches")
    if not is_naflex(model):
        raise UserError(f"{flag} sizes the images of a NaFlex (SigLIP2) model, and {model.name} reads every image "
                        f"at its image_size {tuple(model.image_size)}: leave {flag} out.")
    if not _is_count(max_num_patches):
        raise UserError(f"{flag} is a count of patches, got {max_num_patches!r}: give a positive whole number "
                        f"(256 to 1024 for the published SigLIP2 towers), or leave it out for the table's "
                        f"{max_patches(model)}.")
    return int(max_num_patches)


def _is_count(value) -> bool:
    """Whether `value` is a whole number of at least 1 (an int, or a float such as 1024.0; not a bool)."""
    try:
        return not isinstance(value, (bool, str)) and value >= 1 and int(value) == value
    except (TypeError, ValueError):
        return False


def pad_batch(images: Sequence[np.ndarray], patch_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Images (h_i, w_i, C), each side a multiple of `patch_size`, as one batch:
    (B, H, W, C) float32 padded with 0 at the bottom and right to the largest
    height and width, and their grids (B, 2) int32 (rows, cols) for `call_padded`."""
    images = [np.asarray(image, np.float32) for image in images]
    if not images:
        raise UserError("pad_batch needs at least one image.")
    for image in images:
        if (image.ndim != 3 or image.shape[0] % patch_size or image.shape[1] % patch_size
                or min(image.shape[:2]) < patch_size):
            raise UserError(f"pad_batch takes (height, width, channels) images whose sides are multiples of the "
                            f"patch size {patch_size} (at least one patch), got {image.shape}: resize each with "
                            f"naflex_size first.")
    height = max(image.shape[0] for image in images)
    width = max(image.shape[1] for image in images)
    batch = np.zeros((len(images), height, width, images[0].shape[2]), np.float32)
    for row, image in enumerate(images):
        batch[row, :image.shape[0], :image.shape[1]] = image
    grids = np.array([(image.shape[0] // patch_size, image.shape[1] // patch_size) for image in images], np.int32)
    return batch, grids


def check_paddable(model) -> None:
    """Refuses, in one line, a model whose tokens a padded batch would change."""
    config = model.config
    reasons = []
    if config.position_embedding not in ("learned_1d", "none"):
        reasons.append(f"its position_embedding={config.position_embedding!r} follows the whole padded grid")
    elif config.position_embedding == "learned_1d" and config.position_interpolation != "bilinear_antialias":
        reasons.append(f"its table is resized per image by SigLIP2's rule only (its own is "
                       f"{config.position_interpolation!r})")
    if config.resnet:
        reasons.append("a ResNet stem's convolutions reach into the padding")
    if config.patch_dropout:
        reasons.append("patch dropout drops tokens the mask would not follow")
    if reasons:
        raise UserError(f"call_padded cannot run {model.name}: {'; '.join(reasons)}. Call the model on each image "
                        f"alone (built with dynamic_image_size=True) instead.")


def grid_mask(grids, rows: int, cols: int):
    """(B, rows * cols) bool: True on the tokens inside each image's own grid (row-major)."""
    grids = ops.cast(grids, "int32")
    inside_rows = ops.arange(rows, dtype="int32")[None, :] < grids[:, :1]  # (B, rows)
    inside_cols = ops.arange(cols, dtype="int32")[None, :] < grids[:, 1:]  # (B, cols)
    return ops.reshape(ops.logical_and(inside_rows[:, :, None], inside_cols[:, None, :]), (-1, rows * cols))


def positions_per_image(layer, grids, rows: int, cols: int):
    """(B, prefix + rows * cols, D): the learned table of `layer` (a PositionEmbedding) resized
    to each image's own grid and placed at the top left of the padded rows x cols grid (the
    padding's positions repeat the image's edge, and are never read: the mask leaves them out)."""
    grids = ops.cast(grids, "float32")
    trained_rows, trained_cols = layer.grid_size
    width = layer.pos_embedding.shape[-1]
    prefix = layer.num_prefix_tokens
    table = ops.cast(layer.pos_embedding, "float32")
    grid = ops.reshape(table[0, prefix:], (trained_rows, trained_cols, width))
    # The padding's rows and columns repeat the image's last (weights past its grid would all be 0).
    row_at = ops.minimum(ops.arange(rows, dtype="float32")[None, :], grids[:, :1] - 1)
    col_at = ops.minimum(ops.arange(cols, dtype="float32")[None, :], grids[:, 1:] - 1)
    along_rows = triangle_weights(ops, trained_rows, row_at, grids[:, :1], "float32")  # (B, rows, trained_rows)
    along_cols = triangle_weights(ops, trained_cols, col_at, grids[:, 1:], "float32")  # (B, cols, trained_cols)
    resized = ops.einsum("bri,ijd,bcj->brcd", along_rows, grid, along_cols)
    resized = ops.reshape(resized, (-1, rows * cols, width))
    batch = ops.shape(resized)[0]
    head = ops.broadcast_to(table[:, :prefix], (batch, prefix, width))
    return ops.concatenate([head, resized], axis=1)


def _check_grids(grids, batch, rows: int, cols: int) -> None:
    """Refuses, in one line, grids (given as values, not traced) that do not fit the padded images."""
    if not isinstance(grids, (np.ndarray, list, tuple)):
        return  # a tensor: the caller's (pad_batch made it, or the graph does)
    grids = np.asarray(grids)
    if (grids.ndim != 2 or grids.shape[1] != 2 or (batch is not None and grids.shape[0] != batch)
            or grids.min() < 1 or grids[:, 0].max() > rows or grids[:, 1].max() > cols):
        raise UserError(f"call_padded needs one (rows, cols) grid per image, each at least 1 x 1 and within the "
                        f"padded images' {rows} x {cols} patches; got {grids.tolist()}. keras_vit.pad_batch makes "
                        f"both.")


def call_padded(model, images, grids, training=False):
    """The model's output for each image of a padded batch, as if it were alone.

    images: (B, H, W, C) as the model takes them, each image at the top left,
    H and W multiples of the patch size (`pad_batch`); grids: (B, 2) the rows
    and columns of patches of each image. The model's own layers run: patch
    embedding, [class token], + each image's own positions, [registers], the
    encoder and the pooling with the padding masked out, then the heads."""
    from keras_vit.model.readout import read_out

    check_paddable(model)
    stride = model.config.total_stride
    rows, cols = int(images.shape[1]) // stride, int(images.shape[2]) // stride
    _check_grids(grids, images.shape[0], rows, cols)
    tokens = model.embed(images, training=training, grids=grids)  # the one embedding path
    mask = grid_mask(grids, rows, cols)
    prefix = model.config.num_prefix_tokens
    if prefix:
        mask = ops.concatenate([ops.ones((ops.shape(mask)[0], prefix), "bool"), mask], axis=1)
    tokens = model.encoder(tokens, training=training, attention_mask=mask)
    return read_out(tokens, model, attention_mask=mask)



def size_rule(model, max_num_patches=None):
    """(height, width) -> the NaFlex size of such an image for `model` within `max_num_patches`
    (None: the table's, `patch_budget`): the size function that keras_vit.images.load_images
    and fit_pixels take."""
    stride, most = model.config.total_stride, patch_budget(model, max_num_patches)
    return lambda height, width: naflex_size(height, width, stride, most)


def naflex_pixels(pixels: np.ndarray, model, max_num_patches=None) -> np.ndarray:
    """One decoded image (H, W, C) 0..255 at its NaFlex size for `model` within `max_num_patches`
    patches (None: the table's), as `keras-vit predict` reads a file (keras_vit.images.fit_pixels:
    bilinear, antialiased, whole pixels): uint8."""
    from keras_vit.images import fit_pixels

    return fit_pixels(pixels, size_rule(model, max_num_patches), model.num_channels)


def batches_by_shape(grids: Sequence[Tuple[int, int]], most_tokens: int, batch_size: int) -> List[List[int]]:
    """Indices of images to pad together: sorted by aspect ratio, a batch closes when it holds
    `batch_size` images or when the next image would make its padded grid (its largest rows x
    largest cols) exceed `most_tokens` (a tall and a wide image would pad each other to a square)."""
    order = sorted(range(len(grids)), key=lambda i: grids[i][0] / grids[i][1])
    batches, rows, cols = [], 0, 0
    for i in order:
        r, c = max(rows, grids[i][0]), max(cols, grids[i][1])
        if not batches or len(batches[-1]) == batch_size or r * c > most_tokens:
            batches.append([])
            r, c = grids[i]
        batches[-1].append(i)
        rows, cols = r, c
    return batches


def outputs_naflex(model, pixels: Sequence[np.ndarray], batch_size: int = 32, max_num_patches=None) -> np.ndarray:
    """The model's outputs for images 0..255 of any sizes (each (h, w, C) at its NaFlex size,
    `naflex_pixels` with the same `max_num_patches`), run in padded batches of like shapes
    (`batches_by_shape`: at most twice the patch budget per image), in the images' order:
    (B, ...) as numpy."""
    from keras_vit.images import model_inputs

    stride = model.config.total_stride
    grids = [(image.shape[0] // stride, image.shape[1] // stride) for image in pixels]
    outputs = [None] * len(pixels)
    # The budget bounds only how images share a batch: each image's own grid sets its positions.
    most_tokens = 2 * max(patch_budget(model, max_num_patches), max((r * c for r, c in grids), default=1))
    for indices in batches_by_shape(grids, most_tokens, batch_size):
        chunk = [np.asarray(model_inputs(model, pixels[i][None]))[0] for i in indices]
        batch, batch_grids = pad_batch(chunk, stride)
        for i, row in zip(indices, np.asarray(call_padded(model, batch, batch_grids), np.float32)):
            outputs[i] = row
    return np.stack(outputs)
