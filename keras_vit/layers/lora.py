"""A low-rank update of one projection (LoRA, Hu et al. 2021)."""

import math

import keras
from keras import ops

from keras_vit.config import DEFAULT_LORA_TARGETS, LORA_TARGETS


def check_lora(lora):
    """lora: {"rank", "alpha", "targets"} as a layer's config holds it -> the same,
    checked and in canonical form; None or a rank of 0: None."""
    if not lora or not int(lora.get("rank", 0)):
        return None
    rank = int(lora["rank"])
    alpha = float(lora.get("alpha") or rank)
    targets = tuple(lora.get("targets") or DEFAULT_LORA_TARGETS)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if rank < 0 or unknown or not targets:
        raise ValueError(f"LoRA needs a positive rank and targets among {LORA_TARGETS}; got rank {rank}, "
                         f"targets {list(targets)}.")
    return {"rank": rank, "alpha": alpha, "targets": [t for t in LORA_TARGETS if t in targets]}


@keras.saving.register_keras_serializable(package="keras_vit")
class LowRankUpdate(keras.layers.Layer):
    """alpha / rank * (x A) B, the update a frozen projection W gets in LoRA:
    W x + alpha / rank * B A x, with A (in, rank) and B (rank, out) on the
    projection seen as a matrix, its input axes and its output axes each
    flattened (peft's layout: lora_A.weight = A^T, lora_B.weight = B^T).
    The attention's query of a (D, heads, head_dim) kernel has A (D, rank)
    and B (rank, heads * head_dim), so rank counts as in peft and in the
    paper, whatever the kernel's axes.

    A starts as peft's (uniform in +-1/sqrt(in)), B at zero: the updated
    projection starts as the frozen one.

    Args:
        rank: the update's rank.
        alpha: its scale is alpha / rank.
        output_shape: the projection's output axes after the tokens, e.g.
            (heads, head_dim) for a query, (D,) for the attention's output.
        input_axes: how many trailing input axes the projection contracts
            (1: (B, T, D); 2: the output projection's (B, T, heads, head_dim)).
    """

    def __init__(self, rank, alpha, output_shape, input_axes=1, **kwargs):
        super().__init__(**kwargs)
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.output_axes = tuple(int(s) for s in output_shape)
        self.input_axes = int(input_axes)

    def build(self, input_shape):
        fan_in = math.prod(int(s) for s in input_shape[-self.input_axes:])
        bound = 1.0 / math.sqrt(fan_in)
        self.lora_a = self.add_weight(name="lora_a", shape=(fan_in, self.rank),
                                      initializer=keras.initializers.RandomUniform(-bound, bound))
        self.lora_b = self.add_weight(name="lora_b", shape=(self.rank, math.prod(self.output_axes)),
                                      initializer="zeros")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def call(self, x):
        # The factors take the projection's axes (not the activations: their token axis may be unknown).
        a = ops.reshape(self.lora_a, (*x.shape[-self.input_axes:], self.rank))
        b = ops.reshape(self.lora_b, (self.rank, *self.output_axes))
        low = ops.tensordot(x, ops.cast(a, x.dtype), axes=self.input_axes)
        return ops.tensordot(low, ops.cast(b * self.scale, x.dtype), axes=1)

    def delta(self):
        """The update as a (in, out) matrix: what merging adds to the kernel."""
        return ops.matmul(self.lora_a, self.lora_b) * self.scale

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-self.input_axes], *self.output_axes)

    def get_config(self):
        return {**super().get_config(), "rank": self.rank, "alpha": self.alpha,
                "output_shape": list(self.output_axes), "input_axes": self.input_axes}
