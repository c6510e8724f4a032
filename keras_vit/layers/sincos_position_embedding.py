"""Fixed 2-D sin-cos position embedding (MAE / big_vision): no weights."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.grid_resize import add_positions
from keras_vit.layers.position_embedding_2d import check_token_count, grid_tuple


def sincos_2d_table(grid_size, width, temperature=10000.0):
    """The (rows * cols, width) sin-cos table of a row-major patch grid.

    The column coordinate x fills the first half of the width and the row
    coordinate y the second, each as [sin(p * w_0..), cos(p * w_0..)] with
    frequencies w_i = temperature ** (-i / (width / 4)), i < width / 4: MAE's
    `get_2d_sincos_pos_embed` (big_vision's `posemb_sincos_2d` is the same
    layout with i / (width / 4 - 1)). Positions are grid indices, so a
    larger grid extends the table instead of stretching it.
    """
    rows, cols = grid_tuple(grid_size)
    if width % 4:
        raise ValueError(f"A 2-D sin-cos table splits the width in four (sin, cos of x and y); {width} is not "
                         f"divisible by 4.")
    quarter = width // 4
    frequencies = 1.0 / temperature ** (np.arange(quarter, dtype=np.float64) / quarter)
    y, x = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    x_angles = x.reshape(-1, 1) * frequencies  # (rows * cols, width / 4)
    y_angles = y.reshape(-1, 1) * frequencies
    table = np.concatenate([np.sin(x_angles), np.cos(x_angles), np.sin(y_angles), np.cos(y_angles)], axis=1)
    return table.astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_vit")
class SinCosPositionEmbedding2D(keras.layers.Layer):
    """Adds the fixed 2-D sin-cos table (`sincos_2d_table`) to the patch tokens.

    Prefix tokens (the class token) get zeros, as in MAE. Nothing is
    learned or saved: a model at another resolution computes its own table
    for its grid, so resizing has nothing to do.

    Args:
        grid_size: (rows, cols) of the patch grid (an int for a square).
        num_prefix_tokens: tokens before the grid (1 with a class token).
        temperature: the longest wavelength's base (10,000, as everywhere).
        stride: pixels per token side; set by a dynamic model
            (dynamic_image_size=True), whose call passes its images so that
            the table is computed for their grid.
    """

    def __init__(self, grid_size, num_prefix_tokens=0, temperature=10000.0, stride=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = grid_tuple(grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.temperature = float(temperature)
        self.stride = None if stride is None else int(stride)

    def build(self, input_shape):
        check_token_count(self, input_shape, self.grid_size, self.num_prefix_tokens)
        width = input_shape[-1]
        grid = sincos_2d_table(self.grid_size, width, self.temperature)
        self._table = np.concatenate([np.zeros((self.num_prefix_tokens, width), np.float32), grid])[None]

    def table(self):
        """The (1, prefix + rows * cols, D) embedding (a constant)."""
        return ops.convert_to_tensor(self._table)

    def table_at(self, rows, cols):
        """The table of a rows x cols grid computed in the graph (`sincos_2d_table`'s
        formula in Keras ops, for a grid known only at run time)."""
        width = self._table.shape[-1]
        quarter = width // 4
        frequencies = 1.0 / self.temperature ** (np.arange(quarter, dtype=np.float64) / quarter)
        frequencies = ops.convert_to_tensor(frequencies.astype(np.float32))[None, :]
        y = ops.cast(ops.arange(rows * cols) // cols, "float32")[:, None] * frequencies
        x = ops.cast(ops.arange(rows * cols) % cols, "float32")[:, None] * frequencies
        grid = ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=1)
        return ops.concatenate([ops.zeros((self.num_prefix_tokens, width)), grid], axis=0)[None]

    def call(self, tokens, images=None):
        return add_positions(self, tokens, images)

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def get_config(self):
        return {**super().get_config(), "grid_size": list(self.grid_size),
                "num_prefix_tokens": self.num_prefix_tokens, "temperature": self.temperature,
                "stride": self.stride}
