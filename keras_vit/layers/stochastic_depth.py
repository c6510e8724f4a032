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

    @property
    def seed_generators(self):
        """The random state this layer draws from (see `seed_generators_of`)."""
        return [self.seed_generator]

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


def seed_generators_of(*layers):
    """The keras.random.SeedGenerators that `layers` draw their randomness from,
    by explicit bookkeeping: our layers list theirs in `seed_generators`; Keras'
    Dropout has a public `seed_generator` (only when its rate is above 0: it
    draws nothing otherwise). EncoderBlock's remat rewinds exactly these."""
    found = []
    for layer in layers:
        if hasattr(layer, "seed_generators"):
            found.extend(layer.seed_generators)
        elif getattr(layer, "seed_generator", None) is not None:
            found.append(layer.seed_generator)
    return found
