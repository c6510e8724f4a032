"""PatchDropout (Liu et al. 2022; FLIP, Li et al. 2023): train on a random subset of the patch tokens."""

import keras
from keras import ops

from keras_vit.layers.stochastic_depth import seed_generators_of


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchDropout(keras.layers.Layer):
    """In training, keeps round((1 - rate) x N) of the N patch tokens of each
    example (a fresh random subset per example, in their original order) and
    all `num_prefix_tokens` tokens before them (the class token), then
    applies ordinary dropout at `dropout_rate`; at inference, the dropout
    only, on every token. The encoder's cost falls with the token count, so
    rate 0.5 roughly halves a training step. It stands where the embedding
    dropout stands (after the position embedding), so every kept token
    carries its own position.

    Args:
        rate: fraction of the patch tokens dropped, in [0, 1).
        num_prefix_tokens: tokens before the patch grid, always kept.
        dropout_rate: the embedding dropout applied after the selection.
        seed: of the selection.
    """

    def __init__(self, rate=0.0, num_prefix_tokens=1, dropout_rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.dropout_rate = float(dropout_rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.dropout = keras.layers.Dropout(self.dropout_rate, name="dropout")

    @property
    def seed_generators(self):
        """The random state this layer draws from (see stochastic_depth.seed_generators_of)."""
        return [self.seed_generator, *seed_generators_of(self.dropout)]

    def call(self, x, training=False):
        if training and self.rate > 0:
            x = self.keep_random_patches(x)
        return self.dropout(x, training=training)

    def keep_random_patches(self, x):
        """(B, P + N, D) -> (B, P + K, D): the prefix and K random patch tokens."""
        prefix, patches = x[:, :self.num_prefix_tokens], x[:, self.num_prefix_tokens:]
        num_patches = patches.shape[1]
        keep = max(1, int(round((1.0 - self.rate) * num_patches)))
        noise = keras.random.uniform((ops.shape(x)[0], num_patches), seed=self.seed_generator)
        kept = ops.sort(ops.argsort(noise, axis=-1)[:, :keep], axis=-1)  # (B, K), in grid order
        patches = ops.take_along_axis(patches, kept[:, :, None], axis=1)  # (B, K, D)
        return ops.concatenate([prefix, patches], axis=1)

    def compute_output_shape(self, input_shape):
        return input_shape  # at inference; training drops tokens

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "num_prefix_tokens": self.num_prefix_tokens,
                "dropout_rate": self.dropout_rate, "seed": self.seed}
