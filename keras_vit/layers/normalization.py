"""The normalisation of a family's blocks: LayerNorm (ViT and most of its relatives) or
RMSNorm (AIMv2), built by one factory so every norm of a model is of its config's kind."""

import keras
from keras import ops

NORMS = ("layer_norm", "rms_norm")


@keras.saving.register_keras_serializable(package="keras_vit")
class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + epsilon) * scale over the last axis (Zhang and Sennrich 2019; AIMv2's,
    as transformers' Aimv2RMSNorm computes it: in float32, then scaled in the input's dtype).

    Its weight is `gamma` (saved as "scale", as LayerNorm's) and it has no `beta`, so
    keras_vit.weights.layout reads both kinds of norm alike."""

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.beta = None

    def build(self, input_shape):
        self.gamma = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x32 = ops.cast(x, "float32")
        normalised = x32 * ops.rsqrt(ops.mean(ops.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return ops.cast(self.gamma, x.dtype) * ops.cast(normalised, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


def make_norm(kind, epsilon, name, dtype=None):
    """A norm of `kind` (one of NORMS) named `name`."""
    if kind == "rms_norm":
        return RMSNorm(epsilon, name=name, dtype=dtype)
    if kind != "layer_norm":
        raise ValueError(f"norm must be one of {NORMS}, got {kind!r}.")
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name, dtype=dtype)
