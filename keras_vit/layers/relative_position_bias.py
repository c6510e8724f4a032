"""Relative position: a learned per-head bias of the attention logits for each 2-D offset."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.position_embedding_2d import check_token_count, grid_tuple

# Where a prefix token's pairs read their bias in `prefix_bias` (heads, 3).
PREFIX_TO_PATCH, PATCH_TO_PREFIX, PREFIX_TO_PREFIX = 0, 1, 2


def relative_position_index(grid_size, num_prefix_tokens=0):
    """(T, T) int32: for query token i and key token j, the column of the
    flattened bias table [relative_bias (heads, (2R-1)(2C-1)) | prefix_bias
    (heads, 3)] that holds their bias.

    Patch tokens (row-major, after the prefix) read the offset
    (r_q - r_k + R - 1, c_q - c_k + C - 1) of the (2R-1, 2C-1) table; pairs
    with a prefix token read one of the three prefix entries.
    """
    rows, cols = grid_tuple(grid_size)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    r, c = r.reshape(-1), c.reshape(-1)
    dr = r[:, None] - r[None, :] + rows - 1  # (N, N) in 0 .. 2R-2
    dc = c[:, None] - c[None, :] + cols - 1
    patches = dr * (2 * cols - 1) + dc
    if not num_prefix_tokens:
        return patches.astype(np.int32)
    offsets = (2 * rows - 1) * (2 * cols - 1)
    p, n = num_prefix_tokens, rows * cols
    index = np.empty((p + n, p + n), np.int64)
    index[:p, :p] = offsets + PREFIX_TO_PREFIX
    index[:p, p:] = offsets + PREFIX_TO_PATCH
    index[p:, :p] = offsets + PATCH_TO_PREFIX
    index[p:, p:] = patches
    return index.astype(np.int32)


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(keras.layers.Layer):
    """The bias (1, heads, T, T) that an attention layer adds to its logits.

    `relative_bias` (heads, 2R-1, 2C-1) holds one learned value per head for
    every 2-D offset between two patches of an R x C grid (Swin / BEiT
    style): query patch (r, c) attending to key patch (r', c') gets
    relative_bias[h, r - r' + R - 1, c - c' + C - 1]. The class token has no
    offset to anything, so it gets three learned values per head in
    `prefix_bias` (heads, 3): class token -> patch, patch -> class token,
    class token -> itself (BEiT's treatment). Both start at zero: the model
    starts position-free and learns which offsets matter.

    The paper's relative variant (App. D.4) is 1-D and content-dependent
    (the query dotted with a learned embedding per offset); this one is a
    2-D offset and content-independent, the form later ViTs use.

    Args:
        num_heads: attention heads (one table each).
        grid_size: (rows, cols) of the patch grid (an int for a square).
        num_prefix_tokens: tokens before the grid (1 with a class token).

    `call(tokens)` reads only the tokens' length and dtype. Another
    resolution: resize each head's table along both offset axes
    (keras_vit.weights.resize); the prefix values are kept.
    """

    def __init__(self, num_heads, grid_size, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.grid_size = grid_tuple(grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self._index = relative_position_index(self.grid_size, self.num_prefix_tokens)

    def build(self, input_shape):
        check_token_count(self, input_shape, self.grid_size, self.num_prefix_tokens)
        rows, cols = self.grid_size
        self.relative_bias = self.add_weight(
            name="relative_bias", shape=(self.num_heads, 2 * rows - 1, 2 * cols - 1), initializer="zeros")
        self.prefix_bias = (
            self.add_weight(name="prefix_bias", shape=(self.num_heads, 3), initializer="zeros")
            if self.num_prefix_tokens else None
        )

    def call(self, tokens):
        table = ops.reshape(self.relative_bias, (self.num_heads, -1))
        if self.prefix_bias is not None:
            table = ops.concatenate([table, self.prefix_bias], axis=1)
        bias = ops.take(table, ops.convert_to_tensor(self._index), axis=1)  # (heads, T, T)
        return ops.cast(bias[None], tokens.dtype)

    def compute_output_shape(self, input_shape):
        return (1, self.num_heads, input_shape[1], input_shape[1])

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "grid_size": list(self.grid_size),
                "num_prefix_tokens": self.num_prefix_tokens}
