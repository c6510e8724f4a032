"""Heads that read more than one vector: SigLIP's attention pooling (MAP), AIMv2's
attention pooling, and DeiT's pair of classifiers on the class and distillation tokens."""

import math

import keras
from keras import ops

from keras_vit.layers.attention import masked_softmax
from keras_vit.layers.mlp import MlpBlock


def _projection(head, name, equation, output_shape, bias_axes, build_shape):
    """An attention head's EinsumDense projection, built (Xavier-uniform, the head's dtype policy)."""
    layer = keras.layers.EinsumDense(equation, output_shape=output_shape, bias_axes=bias_axes,
                                     kernel_initializer="glorot_uniform", name=name, dtype=head.dtype_policy)
    layer.build(build_shape)
    return layer


@keras.saving.register_keras_serializable(package="keras_vit")
class MAPHead(keras.layers.Layer):
    """Multihead attention pooling (big_vision's MAPHead; SigLIP's vision head):
    a learned probe attends over the tokens, then x + MLP(LN(x)): (B, N, D) -> (B, D).

    Weights in the layout of big_vision's "MAPHead_0": probe (1, 1, D),
    MultiHeadDotProductAttention_0/{query,key,value,out} as the blocks'
    attention, LayerNorm_0, MlpBlock_0 (its width `mlp_dim`).
    """

    def __init__(self, num_heads, mlp_dim, layer_norm_epsilon=1e-6, gelu_approximate=True, mlp_activation="gelu",
                 **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.mlp_activation = mlp_activation
        policy = self.dtype_policy
        self.norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, name="LayerNorm_0",
                                                    dtype=policy)
        self.mlp = MlpBlock(self.mlp_dim, 0.0, self.gelu_approximate, self.mlp_activation, name="MlpBlock_0",
                            dtype=policy)

    def build(self, input_shape):
        width = input_shape[-1]
        self.head_dim = width // self.num_heads
        self.probe = self.add_weight(name="probe", shape=(1, 1, width), initializer="glorot_uniform")

        heads = (None, self.num_heads, self.head_dim)
        self.query = _projection(self, "query", "btd,dhk->bthk", heads, "hk", (None, 1, width))
        self.key = _projection(self, "key", "btd,dhk->bthk", heads, "hk", input_shape)
        self.value = _projection(self, "value", "btd,dhk->bthk", heads, "hk", input_shape)
        self.out = _projection(self, "out", "bthk,hkd->btd", (None, width), "d", (None, 1, self.num_heads, self.head_dim))
        self.norm.build((None, 1, width))
        self.mlp.build((None, 1, width))

    def call(self, tokens, return_attention_scores=False, attention_mask=None):
        """attention_mask: (B, N), False on padding tokens, which the probe does not attend to."""
        batch = ops.shape(tokens)[0]
        probe = ops.cast(ops.broadcast_to(self.probe, (batch, 1, ops.shape(self.probe)[-1])), tokens.dtype)
        q = self.query(probe) * ops.cast(1.0 / math.sqrt(self.head_dim), tokens.dtype)
        k, v = self.key(tokens), self.value(tokens)
        logits = ops.einsum("bqhk,bthk->bhqt", q, k)
        probs = ops.cast(masked_softmax(logits, attention_mask), v.dtype)
        x = self.out(ops.einsum("bhqt,bthk->bqhk", probs, v))  # (B, 1, D)
        x = x + self.mlp(self.norm(x))
        return (x[:, 0], probs) if return_attention_scores else x[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "layer_norm_epsilon": self.layer_norm_epsilon, "gelu_approximate": self.gelu_approximate,
                "mlp_activation": self.mlp_activation}


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPoolingHead(keras.layers.Layer):
    """AIMv2's attention pooling: a learned query, split across the heads as it is (no query
    projection), attends over the tokens' key and value projections; the heads' outputs,
    concatenated, go through one output projection: (B, N, D) -> (B, D). No norm or MLP
    after it (SigLIP's MAPHead has both).

    Weights: probe (1, 1, D) (transformers' cls_token), key and value (D, heads, head_dim)
    with biases (heads, head_dim) unless use_bias=False (AIMv2's qkv_bias), out (D, D) with
    bias (D,)."""

    def __init__(self, num_heads, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.use_bias = bool(use_bias)

    def build(self, input_shape):
        width = input_shape[-1]
        self.head_dim = width // self.num_heads
        self.probe = self.add_weight(name="probe", shape=(1, 1, width), initializer="zeros")

        heads = (None, self.num_heads, self.head_dim)
        bias = "hk" if self.use_bias else None
        self.key = _projection(self, "key", "btd,dhk->bthk", heads, bias, input_shape)
        self.value = _projection(self, "value", "btd,dhk->bthk", heads, bias, input_shape)
        self.out = _projection(self, "out", "btd,de->bte", (None, width), "e", (None, 1, width))

    def call(self, tokens, return_attention_scores=False, attention_mask=None):
        """attention_mask: (B, N), False on padding tokens, which the query does not attend to."""
        query = ops.reshape(ops.cast(self.probe, tokens.dtype), (1, 1, self.num_heads, self.head_dim))
        k, v = self.key(tokens), self.value(tokens)
        logits = ops.einsum("bqhk,bthk->bhqt", query * ops.cast(1.0 / math.sqrt(self.head_dim), tokens.dtype), k)
        probs = ops.cast(masked_softmax(logits, attention_mask), v.dtype)  # (B, heads, 1, N)
        context = ops.einsum("bhqt,bthk->bqhk", probs, v)
        x = self.out(ops.reshape(context, (-1, 1, self.num_heads * self.head_dim)))[:, 0]
        return (x, probs) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "use_bias": self.use_bias}


@keras.saving.register_keras_serializable(package="keras_vit")
class DistillationHead(keras.layers.Layer):
    """DeiT's two classifiers: "head" on the class token (position 0),
    "head_dist" on the distillation token (position 1); the output is the
    mean of their logits (as transformers' DeiTForImageClassificationWithTeacher
    and timm at inference), then `activation`: (B, N, D) -> (B, classes).
    Zero-initialised, as every fine-tuning head here; float32 under mixed precision."""

    def __init__(self, num_classes, activation=None, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = int(num_classes)
        self.activation = keras.activations.get(activation)
        self.head = keras.layers.Dense(self.num_classes, kernel_initializer="zeros", name="head", dtype="float32")
        self.head_dist = keras.layers.Dense(self.num_classes, kernel_initializer="zeros", name="head_dist",
                                            dtype="float32")

    def build(self, input_shape):
        self.head.build((None, input_shape[-1]))
        self.head_dist.build((None, input_shape[-1]))

    def call(self, tokens):
        tokens = ops.cast(tokens, "float32")
        logits = (self.head(tokens[:, 0]) + self.head_dist(tokens[:, 1])) / 2.0
        return self.activation(logits)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes,
                "activation": keras.activations.serialize(self.activation)}
