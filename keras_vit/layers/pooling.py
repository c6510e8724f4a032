"""Read one vector per image out of the encoded tokens."""

import keras
from keras import ops

from keras_vit.config import CLASSIFIERS


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """(B, N, D) -> (B, D).

    Args:
        classifier: "token" takes the class token (position 0); "gap" averages
            every token (a "gap" model has no class token).
    """

    def __init__(self, classifier="token", **kwargs):
        super().__init__(**kwargs)
        if classifier not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}.")
        self.classifier = classifier

    def call(self, tokens):
        if self.classifier == "token":
            return tokens[:, 0]
        return ops.mean(tokens, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        return {**super().get_config(), "classifier": self.classifier}
