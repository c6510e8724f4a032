"""Learned tokens put into the sequence after the class token: DeiT's
distillation token and DINOv2's registers."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class InsertTokens(keras.layers.Layer):
    """Inserts `num_tokens` learned tokens after the first `offset` tokens:
    (B, N, D) -> (B, N + num_tokens, D).

    DeiT's distillation token goes after the class token before the position
    embedding is added (it has a position); DINOv2's registers after it
    (they have none). Initialised normal(stddev=0.02), as DeiT and timm: the
    registers must differ from one another, or no gradient ever tells them apart.
    """

    def __init__(self, num_tokens, offset=0, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = int(num_tokens)
        self.offset = int(offset)

    def build(self, input_shape):
        self.tokens = self.add_weight(name="tokens", shape=(1, self.num_tokens, input_shape[-1]),
                                      initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        batch = ops.shape(x)[0]
        tokens = ops.cast(ops.broadcast_to(self.tokens, (batch, self.num_tokens, ops.shape(self.tokens)[-1])),
                          x.dtype)
        return ops.concatenate([x[:, :self.offset], tokens, x[:, self.offset:]], axis=1)

    def compute_output_shape(self, input_shape):
        n = None if input_shape[1] is None else input_shape[1] + self.num_tokens
        return (input_shape[0], n, input_shape[2])

    def get_config(self):
        return {**super().get_config(), "num_tokens": self.num_tokens, "offset": self.offset}
