"""Stochastic depth (drop path) on a residual branch."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class StochasticDepth(keras.layers.Layer):
    """Zeroes a whole residual branch per example with probability `rate`.

    Kept branches are scaled by 1 / (1 - rate) so the expectation is unchanged;
    at inference the layer is the identity.
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=False):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = keras.random.uniform(shape, seed=self.seed_generator) < keep
        return ops.where(mask, x / ops.cast(keep, x.dtype), ops.zeros_like(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
