"""Multi-head self-attention with the official checkpoint's weight layout."""

import math

import keras
from keras import ops


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

    `call(x, return_attention_scores=True)` also returns the probabilities
    (B, heads, N, N). The fast path uses `keras.ops.dot_product_attention`
    (each backend's fused kernel); when the probabilities are asked for, or
    attention dropout is active, they are computed explicitly. Both paths
    compute softmax(q k^T / sqrt(head_dim)) v from the same weights.
    """

    def __init__(self, num_heads, attention_dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(f"Token width {hidden_size} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = hidden_size // self.num_heads

        def projection(name):
            layer = keras.layers.EinsumDense(
                "btd,dhk->bthk",
                output_shape=(None, self.num_heads, self.head_dim),
                bias_axes="hk",
                kernel_initializer="glorot_uniform",
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build(input_shape)
            return layer

        self.query = projection("query")
        self.key = projection("key")
        self.value = projection("value")
        self.out = keras.layers.EinsumDense(
            "bthk,hkd->btd",
            output_shape=(None, hidden_size),
            bias_axes="d",
            kernel_initializer="glorot_uniform",
            name="out",
            dtype=self.dtype_policy,
        )
        self.out.build((input_shape[0], input_shape[1], self.num_heads, self.head_dim))

    def call(self, x, training=False, return_attention_scores=False):
        q, k, v = self.query(x), self.key(x), self.value(x)  # each (B, N, heads, head_dim)
        explicit = return_attention_scores or (training and self.attention_dropout_rate > 0)
        if explicit:
            scale = 1.0 / math.sqrt(self.head_dim)
            logits = ops.einsum("bqhk,bthk->bhqt", q * ops.cast(scale, q.dtype), k)  # (B, heads, N, N)
            probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), v.dtype)
            context = ops.einsum("bhqt,bthk->bqhk", self.dropout(probs, training=training), v)
        else:
            context = ops.dot_product_attention(q, k, v)  # (B, N, heads, head_dim)
        y = self.out(context)  # (B, N, D)
        return (y, probs) if return_attention_scores else y

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "attention_dropout_rate": self.attention_dropout_rate,
        }
