"""Learned 1-D position embedding added to the token sequence."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned (1, N, D) table to the tokens.

    Initialised with normal(stddev=0.02), as in the official implementation.
    Its length is fixed at build time; to use a model at another resolution,
    resize the table with `keras_vit.resize_position_embedding`.
    """

    def build(self, input_shape):
        if input_shape[1] is None:
            raise ValueError("PositionEmbedding needs a known sequence length: give the model a fixed image size.")
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, input_shape[1], input_shape[2]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def table(self):
        """The (1, N, D) embedding every token gets (the same interface as the 2-D layers)."""
        return self.pos_embedding

    def call(self, tokens):
        return tokens + ops.cast(self.pos_embedding, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape
