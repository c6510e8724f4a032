"""Read one vector per image out of the encoded tokens."""

import keras
from keras import ops

from keras_vit.config import CLASSIFIERS


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """(B, N, D) -> (B, D) (or (B, 2 D) for "token_gap").

    Args:
        classifier: "token" takes the class token (position 0); "gap"
            averages the patch tokens; "token_gap" puts the class token next
            to that mean (DINOv2's classifier input). ("map" is MAPHead.)
        num_prefix_tokens: tokens before the patch grid, left out of the
            mean (registers of a "gap" model; class, registers for "token_gap").
    """

    def __init__(self, classifier="token", num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        if classifier not in CLASSIFIERS or classifier in ("map", "attention_pool"):
            raise ValueError(f"classifier must be one of ('token', 'gap', 'token_gap') (\"map\" is MAPHead, "
                             f"\"attention_pool\" AttentionPoolingHead), got {classifier!r}.")
        self.classifier = classifier
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens, attention_mask=None):
        """attention_mask: (B, N), False on padding tokens, which the mean leaves out."""
        if self.classifier == "token":
            return tokens[:, 0]
        patches = tokens[:, self.num_prefix_tokens:]
        if attention_mask is None:
            mean = ops.mean(patches, axis=1)
        else:
            # In float32, as the plain mean of a low-precision model is (Keras' mean), then cast back.
            real = ops.cast(attention_mask[:, self.num_prefix_tokens:, None], "float32")
            mean = ops.sum(ops.cast(patches, "float32") * real, axis=1) / ops.sum(real, axis=1)
            mean = ops.cast(mean, patches.dtype)
        if self.classifier == "gap":
            return mean
        return ops.concatenate([tokens[:, 0], mean], axis=-1)

    def compute_output_shape(self, input_shape):
        width = input_shape[2] * (2 if self.classifier == "token_gap" else 1)
        return (input_shape[0], width)

    def get_config(self):
        config = {**super().get_config(), "classifier": self.classifier}
        if self.num_prefix_tokens:  # older files lack the key: their "gap" models had no prefix
            config["num_prefix_tokens"] = self.num_prefix_tokens
        return config
