"""Multi-head self-attention with the official checkpoint's weight layout."""

import math

import keras
from keras import ops

from keras_vit.layers.lora import LowRankUpdate, check_lora
from keras_vit.layers.position_embedding_2d import grid_tuple
from keras_vit.layers.quantization import projection_policy
from keras_vit.layers.relative_position_bias import RelativePositionBias
from keras_vit.layers.rotary import rotate
from keras_vit.layers.stochastic_depth import seed_generators_of


ATTENTION_PROJECTIONS = ("query", "key", "value", "out")


def key_mask(attention_mask):
    """The boolean mask of the keys each query may see, for every head: (B, N) real-token flags
    (the same keys for every query) -> (B, 1, 1, N); (B, N, N) flags of query i seeing key j
    (a text tower's causal mask) -> (B, 1, N, N)."""
    mask = ops.cast(attention_mask, "bool")
    return mask[:, None, None, :] if len(mask.shape) == 2 else mask[:, None, :, :]


def masked_softmax(logits, attention_mask=None):
    """The float32 softmax over the last axis (keys) of attention logits (B, heads, Q, N), the keys
    that `attention_mask` (B, N) marks as padding left out."""
    logits = ops.cast(logits, "float32")
    if attention_mask is not None:
        logits = ops.where(key_mask(attention_mask), logits, -1e30)
    return ops.softmax(logits, axis=-1)


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head dot-product self-attention.

    Weights have the shapes of the official Flax `MultiHeadDotProductAttention`
    (and of Keras `MultiHeadAttention`): query/key/value kernels (D, heads,
    head_dim) with biases (heads, head_dim); the output kernel (heads,
    head_dim, D) with bias (D,).

    Args:
        num_heads: number of heads; head_dim = D / num_heads.
        attention_dropout_rate: dropout on the attention probabilities.
        relative_position_grid: (rows, cols) of the patch grid to give the
            layer a RelativePositionBias (position_embedding="relative"):
            its per-head bias is added to the logits before the softmax, in
            both paths. None (default): no bias.
        num_prefix_tokens: tokens before the grid (1 with a class token),
            for the relative bias.

    `call(x, rope=(cos, sin))` turns the queries and keys of the patch tokens
    (those after `num_prefix_tokens`) by the angles of RotaryEmbedding2D
    (position_embedding="rope"); the prefix tokens are not turned.

    lora: {"rank", "alpha", "targets"}: a LowRankUpdate beside each of the
        projections among query, key, value and out that `targets` names
        (LoRA fine-tuning, keras_vit.model.lora); None: none.
    quantization: "int8" or "int4": the four projections are
        built quantised (keras_vit.layers.quantization); None: float.
    biases: which of query, key, value and out have a bias (all by
        default; AIMv2's none).

    `call(x, attention_mask=m)`: m (B, N) is True where a token is real and
    False where it is padding (a NaFlex batch, keras_vit.model.naflex): no
    token attends to padding, so a real token's output is the same as in
    its image alone. m (B, N, N) says which keys each query sees (CLIP's
    text tower: the causal mask and the padding together).

    `call(x, return_attention_scores=True)` also returns the probabilities
    (B, heads, N, N). The fast path uses `keras.ops.dot_product_attention`
    (each backend's fused kernel); when the probabilities are asked for, or
    attention dropout is active, they are computed explicitly. Both paths
    compute softmax(q k^T / sqrt(head_dim) [+ bias]) v from the same weights.
    """

    def __init__(self, num_heads, attention_dropout_rate=0.0, relative_position_grid=None, num_prefix_tokens=0,
                 lora=None, quantization=None, biases=ATTENTION_PROJECTIONS, **kwargs):
        super().__init__(**kwargs)
        self.biases = tuple(name for name in ATTENTION_PROJECTIONS if name in biases)
        self.lora = check_lora(lora)
        self.quantization = quantization or None
        self.query_lora = self.key_lora = self.value_lora = self.out_lora = None  # LowRankUpdates, set in build
        self.num_heads = int(num_heads)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.relative_position_grid = None if relative_position_grid is None else grid_tuple(relative_position_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy)
        self.relative_position_bias = (
            RelativePositionBias(self.num_heads, self.relative_position_grid, self.num_prefix_tokens,
                                 name="relative_position_bias", dtype=self.dtype_policy)
            if self.relative_position_grid is not None else None
        )

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(f"Token width {hidden_size} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = hidden_size // self.num_heads

        def projection(name):
            layer = keras.layers.EinsumDense(
                "btd,dhk->bthk",
                output_shape=(None, self.num_heads, self.head_dim),
                bias_axes="hk" if name in self.biases else None,
                kernel_initializer="glorot_uniform",
                name=name,
                dtype=projection_policy(self.dtype_policy, self.quantization),
            )
            layer.build(input_shape)
            return layer

        self.query = projection("query")
        self.key = projection("key")
        self.value = projection("value")
        self.out = keras.layers.EinsumDense(
            "bthk,hkd->btd",
            output_shape=(None, hidden_size),
            bias_axes="d" if "out" in self.biases else None,
            kernel_initializer="glorot_uniform",
            name="out",
            dtype=projection_policy(self.dtype_policy, self.quantization),
        )
        self.out.build((input_shape[0], input_shape[1], self.num_heads, self.head_dim))
        for name in ("query", "key", "value", "out"):  # LoRA: a low-rank update beside the targeted projections
            if self.lora and name in self.lora["targets"]:
                outputs, inputs = ((hidden_size,), 2) if name == "out" else ((self.num_heads, self.head_dim), 1)
                update = LowRankUpdate(self.lora["rank"], self.lora["alpha"], outputs, inputs, name=f"{name}_lora",
                                       dtype=self.dtype_policy)
                update.build(input_shape if name != "out" else (*input_shape[:2], self.num_heads, self.head_dim))
                setattr(self, f"{name}_lora", update)
        if self.relative_position_bias is not None:
            self.relative_position_bias.build(input_shape)

    @property
    def seed_generators(self):
        """The random state of this layer's dropout (what EncoderBlock's remat rewinds)."""
        return seed_generators_of(self.dropout)

    def call(self, x, training=False, return_attention_scores=False, rope=None, attention_mask=None):
        q, k, v = (self._project(name, x) for name in ("query", "key", "value"))  # each (B, N, heads, head_dim)
        if rope is not None:
            q, k = self._rotated(q, *rope), self._rotated(k, *rope)
        # (1, heads, N, N), added after the 1/sqrt(head_dim) scaling in both paths.
        bias = self.relative_position_bias(x) if self.relative_position_bias is not None else None
        explicit = return_attention_scores or (training and self.attention_dropout_rate > 0)
        if explicit:
            scale = 1.0 / math.sqrt(self.head_dim)
            logits = ops.einsum("bqhk,bthk->bhqt", q * ops.cast(scale, q.dtype), k)  # (B, heads, N, N)
            if bias is not None:
                logits = logits + ops.cast(bias, logits.dtype)
            probs = ops.cast(masked_softmax(logits, attention_mask), v.dtype)
            context = ops.einsum("bhqt,bthk->bqhk", self.dropout(probs, training=training), v)
        else:
            context = ops.dot_product_attention(
                q, k, v, bias=None if bias is None else ops.cast(bias, q.dtype),
                mask=None if attention_mask is None else key_mask(attention_mask))  # (B, N, heads, head_dim)
        y = self._project("out", context)  # (B, N, D)
        return (y, probs) if return_attention_scores else y

    def _project(self, name, x):
        """The projection `name` of x, plus its low-rank update where it has one."""
        y = getattr(self, name)(x)
        update = getattr(self, f"{name}_lora")
        return y if update is None else y + update(x)

    def _rotated(self, x, cos, sin):
        prefix = self.num_prefix_tokens
        return ops.concatenate([x[:, :prefix], rotate(x[:, prefix:], cos, sin)], axis=1)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "attention_dropout_rate": self.attention_dropout_rate,
            "relative_position_grid": (
                None if self.relative_position_grid is None else list(self.relative_position_grid)),
            "num_prefix_tokens": self.num_prefix_tokens,
            **({"lora": self.lora} if self.lora else {}),  # only when set: older files lack the key
            **({"quantization": self.quantization} if self.quantization else {}),
            **({"biases": list(self.biases)} if self.biases != ATTENTION_PROJECTIONS else {}),
        }
