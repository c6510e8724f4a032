"""BERT-style corruption of patch embeddings for masked patch prediction (paper, Sec. 4.6 / App. B.1.2)."""

import keras
from keras import ops

# What happens to a corrupted position (the values of `kinds`).
KEPT, MASKED, RANDOM = 0, 1, 2


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchCorruption(keras.layers.Layer):
    """Corrupts a fixed share of each image's patch embeddings.

    Of the N tokens of every image, exactly round(corrupt_rate * N) are
    chosen at random. Each chosen token is independently replaced by a learned
    [mask] embedding (probability `mask_rate`), by the embedding of another
    patch of the same image at a different position, drawn uniformly
    (`random_rate`), or kept as it is (the rest). The paper's setting is
    50% corrupted, of those 80% / 10% / 10%.

    The layer corrupts whenever it is called, in training and in evaluation:
    it exists only for the pre-training objective.

    Args:
        corrupt_rate: share of the tokens of each image that are corrupted.
        mask_rate: probability that a corrupted token becomes [mask].
        random_rate: probability that a corrupted token becomes another patch.
        seed: seed of the layer's random stream.

    Call: tokens (B, N, D) -> (corrupted tokens (B, N, D), corrupted (B, N)
    float 0/1, kinds (B, N) int32: KEPT, MASKED or RANDOM where corrupted,
    KEPT elsewhere).
    """

    def __init__(self, corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.corrupt_rate = float(corrupt_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        if not 0.0 < self.corrupt_rate <= 1.0:
            raise ValueError(f"corrupt_rate must be in (0, 1], got {corrupt_rate}.")
        if self.mask_rate < 0 or self.random_rate < 0 or self.mask_rate + self.random_rate > 1.0:
            raise ValueError(f"mask_rate and random_rate must be >= 0 with a sum <= 1, got {mask_rate} and "
                             f"{random_rate}.")
        self.seed = seed
        # Named, so that its state variable has the same path however many
        # models a process builds (checkpoints compare variable paths).
        self.seed_generator = keras.random.SeedGenerator(seed, name=f"{self.name}_seed_generator")

    def build(self, input_shape):
        # Small random values, like BERT's embedding table (a zero [mask] would
        # be indistinguishable from a blank patch of a zero-bias projection).
        self.mask_embedding = self.add_weight(
            name="mask_embedding", shape=(input_shape[-1],),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def num_corrupted(self, num_tokens):
        """How many of num_tokens patches are corrupted: corrupt_rate of them, at least one."""
        return max(1, int(round(self.corrupt_rate * num_tokens)))

    def call(self, tokens):
        batch, num_tokens = ops.shape(tokens)[0], tokens.shape[1]
        k = self.num_corrupted(num_tokens)
        # Exactly k positions per image: those with the k largest uniform scores.
        scores = keras.random.uniform((batch, num_tokens), seed=self.seed_generator)
        kth_largest = ops.top_k(scores, k)[0][:, -1:]  # (B, 1)
        corrupted = scores >= kth_largest  # (B, N)
        draw = keras.random.uniform((batch, num_tokens), seed=self.seed_generator)
        masked = ops.logical_and(corrupted, draw < self.mask_rate)
        randomised = ops.logical_and(corrupted, ops.logical_and(draw >= self.mask_rate,
                                                                draw < self.mask_rate + self.random_rate))
        # Another position of the same image: i + offset mod N, offset uniform in 1..N-1.
        offset = keras.random.randint((batch, num_tokens), 1, max(num_tokens, 2), seed=self.seed_generator)
        source = (ops.arange(num_tokens)[None, :] + offset) % num_tokens  # (B, N)
        others = ops.take_along_axis(tokens, ops.expand_dims(source, -1), axis=1)  # (B, N, D)
        mask_token = ops.cast(self.mask_embedding, tokens.dtype)[None, None, :]
        out = ops.where(masked[..., None], mask_token, tokens)
        out = ops.where(randomised[..., None], others, out)
        kinds = ops.cast(masked, "int32") * MASKED + ops.cast(randomised, "int32") * RANDOM
        return out, ops.cast(corrupted, "float32"), kinds

    def compute_output_shape(self, input_shape):
        return input_shape, input_shape[:2], input_shape[:2]

    def get_config(self):
        return {**super().get_config(), "corrupt_rate": self.corrupt_rate, "mask_rate": self.mask_rate,
                "random_rate": self.random_rate, "seed": self.seed}
