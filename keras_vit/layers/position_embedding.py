"""Learned 1-D position embedding added to the token sequence."""

import math

import keras
from keras import ops

from keras_vit.layers.grid_resize import add_positions
from keras_vit.layers.interpolation import resize_grid_ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned (1, N, D) table to the tokens.

    Initialised with normal(stddev=0.02), as in the official implementation.
    Its length is fixed at build time; to use a model at another resolution,
    resize the table with `keras_vit.resize_position_embedding`, or build the
    model with dynamic_image_size=True, which resizes it in the graph.

    Args:
        grid_size: (rows, cols) of the trained patch grid; needed only when
            the layer is called with images (a dynamic model), None infers
            a square grid from the table.
        num_prefix_tokens: tokens before the grid (1 with a class token).
        stride: pixels per token side; set by a dynamic model, whose call
            passes its images so that the table follows their grid.
        interpolation: how the table is resized to another grid in the
            graph: "linear" (the official loader's) or a family's torch
            "bicubic" / "bicubic_antialias" (keras_vit.layers.interpolation).
    """

    def __init__(self, grid_size=None, num_prefix_tokens=0, stride=None, interpolation="linear", **kwargs):
        super().__init__(**kwargs)
        self.interpolation = interpolation
        self.grid_size = None if grid_size is None else tuple(int(s) for s in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)

    def build(self, input_shape):
        length = input_shape[1]
        if length is None and self.grid_size is not None:
            length = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        if length is None:
            raise ValueError("PositionEmbedding needs a known sequence length: give the model a fixed image size.")
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, length, input_shape[2]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )
        if self.grid_size is None:
            side = math.isqrt(length - self.num_prefix_tokens)
            self.grid_size = (side, side)

    def table(self):
        """The (1, N, D) embedding every token gets (the same interface as the 2-D layers)."""
        return self.pos_embedding

    def table_at(self, rows, cols):
        """The table resized to a rows x cols grid (keras_vit.weights.resize's rule: prefix kept)."""
        prefix = self.num_prefix_tokens
        width = self.pos_embedding.shape[-1]
        grid = ops.reshape(self.pos_embedding[0, prefix:], (*self.grid_size, width))
        # In float32 whatever the policy (torch's bicubic runs in float32: DINOv2 casts to it).
        grid = ops.reshape(resize_grid_ops(grid, rows, cols, self.interpolation), (1, -1, width))
        return ops.concatenate([self.pos_embedding[:, :prefix], grid], axis=1)

    def call(self, tokens, images=None):
        return add_positions(self, tokens, images)

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def get_config(self):
        config = {**super().get_config(), "grid_size": None if self.grid_size is None else list(self.grid_size),
                  "num_prefix_tokens": self.num_prefix_tokens, "stride": self.stride}
        if self.interpolation != "linear":  # older files lack the key: they are all linear
            config["interpolation"] = self.interpolation
        return config
