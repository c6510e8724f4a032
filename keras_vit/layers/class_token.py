"""The learned [class] token prepended to the patch sequence."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends one learned token: (B, N, D) -> (B, N + 1, D).

    Zero-initialised, as in the official implementation.
    """

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        cls = ops.cast(ops.broadcast_to(self.cls, (batch, 1, ops.shape(self.cls)[-1])), tokens.dtype)
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        n = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], n, input_shape[2])
