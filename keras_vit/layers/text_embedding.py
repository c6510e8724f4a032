"""A text tower's input: each token's learned vector plus its position's."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class TextEmbedding(keras.layers.Layer):
    """Token ids (B, L) -> token vectors plus learned position vectors (B, L, width), for
    L up to `max_positions` (SigLIP's and CLIP's `embeddings`: token_embedding plus
    position_embedding of the first L positions)."""

    def __init__(self, vocab_size, max_positions, width, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.max_positions = int(max_positions)
        self.width = int(width)

    def build(self, input_shape=None):
        # Normal(0.02) as transformers initialises both tables.
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.token_table = self.add_weight(name="token_embedding", shape=(self.vocab_size, self.width),
                                           initializer=init)
        self.position_table = self.add_weight(name="position_embedding", shape=(self.max_positions, self.width),
                                              initializer=init)

    def call(self, token_ids):
        length = ops.shape(token_ids)[1]
        tokens = ops.take(self.token_table, ops.cast(token_ids, "int32"), axis=0)
        return tokens + ops.cast(self.position_table[:length], tokens.dtype)[None]

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.width)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "max_positions": self.max_positions,
                "width": self.width}
