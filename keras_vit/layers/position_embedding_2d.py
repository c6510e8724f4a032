"""Learned 2-D position embedding: a column table and a row table, concatenated."""

import keras
from keras import ops

from keras_vit.layers.grid_resize import add_positions
from keras_vit.layers.interpolation import resize_along_ops


def grid_tuple(grid_size):
    """(rows, cols) as ints, from an int (square) or a pair."""
    if isinstance(grid_size, int):
        return (grid_size, grid_size)
    rows, cols = (int(s) for s in grid_size)
    if rows < 1 or cols < 1:
        raise ValueError(f"grid_size must be positive (rows, cols), got {grid_size!r}.")
    return (rows, cols)


def check_token_count(layer, input_shape, grid_size, num_prefix_tokens):
    """The tokens must be the prefix tokens then the row-major grid."""
    expected = num_prefix_tokens + grid_size[0] * grid_size[1]
    if input_shape[1] is not None and input_shape[1] != expected:
        raise ValueError(
            f"{type(layer).__name__} was made for {num_prefix_tokens} prefix token(s) and a {grid_size[0]}x"
            f"{grid_size[1]} grid ({expected} tokens) but got {input_shape[1]} tokens: build it with the "
            f"model's grid_size and class-token count.")


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding2D(keras.layers.Layer):
    """Adds the paper's 2-D position embedding (Appendix D.4).

    Two learned tables of width D/2: `column_embedding` (cols, D/2), the
    X-embedding, and `row_embedding` (rows, D/2), the Y-embedding. The patch
    in row r and column c gets concat(column_embedding[c], row_embedding[r])
    (X first, as the paper words it; the MAE / big_vision sin-cos tables put
    the column first too). Prefix tokens (the class token) have no grid
    position, so each gets its own learned D-vector, `prefix_embedding`.
    Initialised with normal(stddev=0.02), like the 1-D table.

    Args:
        grid_size: (rows, cols) of the patch grid (an int for a square).
        num_prefix_tokens: tokens before the grid (1 with a class token).
        stride: pixels per token side; set by a dynamic model
            (dynamic_image_size=True), whose call passes its images so that
            the tables follow their grid.

    Another resolution: resize each table along its own axis
    (keras_vit.weights.resize), linear with the corners aligned.
    """

    def __init__(self, grid_size, num_prefix_tokens=0, stride=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = grid_tuple(grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)

    def build(self, input_shape):
        check_token_count(self, input_shape, self.grid_size, self.num_prefix_tokens)
        width = input_shape[-1]
        if width % 2:
            raise ValueError(f"PositionEmbedding2D splits the token width in two halves; {width} is odd.")
        init = keras.initializers.RandomNormal(stddev=0.02)
        rows, cols = self.grid_size
        self.column_embedding = self.add_weight(name="column_embedding", shape=(cols, width // 2), initializer=init)
        self.row_embedding = self.add_weight(name="row_embedding", shape=(rows, width // 2), initializer=init)
        self.prefix_embedding = (
            self.add_weight(name="prefix_embedding", shape=(self.num_prefix_tokens, width), initializer=init)
            if self.num_prefix_tokens else None
        )

    def table(self):
        """The (1, prefix + rows * cols, D) embedding, patches in row-major order."""
        return self._compose(self.column_embedding, self.row_embedding)

    def table_at(self, rows, cols):
        """The table of a rows x cols grid: each learned table resized along its
        own axis (keras_vit.weights.resize's rule), the prefix vectors kept."""
        return self._compose(resize_along_ops(self.column_embedding, cols, 0),
                             resize_along_ops(self.row_embedding, rows, 0))

    def _compose(self, column_embedding, row_embedding):
        # (1, cols, D/2) and (rows, 1, D/2) broadcast against each other to the (rows, cols, D/2) grid.
        columns = column_embedding[None, :, :] + ops.zeros_like(row_embedding[:, None, :1])
        row_part = row_embedding[:, None, :] + ops.zeros_like(column_embedding[None, :, :1])
        grid = ops.concatenate([columns, row_part], axis=-1)  # (rows, cols, D)
        grid = ops.reshape(grid, (-1, grid.shape[-1]))  # (rows * cols, D), row-major
        if self.prefix_embedding is not None:
            grid = ops.concatenate([ops.convert_to_tensor(self.prefix_embedding), grid], axis=0)
        return grid[None]

    def call(self, tokens, images=None):
        return add_positions(self, tokens, images)

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def get_config(self):
        return {**super().get_config(), "grid_size": list(self.grid_size),
                "num_prefix_tokens": self.num_prefix_tokens, "stride": self.stride}
