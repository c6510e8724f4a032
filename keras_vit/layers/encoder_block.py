"""One pre-LayerNorm Transformer encoder block."""

import keras

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.config import PROJECTIONS
from keras_vit.layers.lora import check_lora
from keras_vit.layers.mlp import MlpBlock
from keras_vit.layers.normalization import make_norm
from keras_vit.layers.position_embedding_2d import grid_tuple
from keras_vit.layers.stochastic_depth import StochasticDepth, seed_generators_of

# The official code uses Flax's LayerNorm default; Keras' default is 1e-3.
LAYER_NORM_EPSILON = 1e-6


@keras.saving.register_keras_serializable(package="keras_vit")
class EncoderBlock(keras.layers.Layer):
    """x + Attention(LN(x)), then x + MLP(LN(x)) (the paper's Eq. 2-3); with
    layer_scale_init each branch is scaled by its own LayerScale (DINOv2).

    Args:
        num_heads: attention heads.
        mlp_dim: hidden width of the MLP.
        dropout_rate: dropout after attention and inside the MLP.
        attention_dropout_rate: dropout on attention probabilities.
        stochastic_depth_rate: probability of dropping each residual branch.
        layer_norm_epsilon: of both LayerNorms (1e-6 official, 1e-12 HF).
        gelu_approximate: tanh GELU (official) or exact (HF, timm, keras-hub).
        relative_position_grid: (rows, cols) of the patch grid for a relative
            position bias in the attention (position_embedding="relative"),
            else None.
        num_prefix_tokens: tokens before the grid (1 with a class token).
        layer_scale_init: initial LayerScale value ("ls1", "ls2"); None: none.
        mlp_activation: "gelu", "quick_gelu" or "swiglu" (MlpBlock).
        lora: {"rank", "alpha", "targets"}: low-rank updates of the targeted
            projections (MultiHeadSelfAttention, MlpBlock); None: none.
        quantization: "int8" or "int4": the attention's and the
            MLP's projections are quantised (keras_vit.layers.quantization).
        norm: "layer_norm" or "rms_norm" (AIMv2), both norms' kind.
        projection_biases: the projections (query, key, value, out, mlp)
            that have a bias: all by default, none in AIMv2.
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0,
                 stochastic_depth_rate=0.0, layer_norm_epsilon=LAYER_NORM_EPSILON, gelu_approximate=True,
                 relative_position_grid=None, num_prefix_tokens=0, layer_scale_init=None, mlp_activation="gelu",
                 lora=None, quantization=None, norm="layer_norm", projection_biases=PROJECTIONS, **kwargs):
        super().__init__(**kwargs)
        self.norm = norm
        self.projection_biases = tuple(name for name in PROJECTIONS if name in projection_biases)
        self.lora = check_lora(lora)
        self.quantization = quantization or None
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        self.mlp_activation = mlp_activation
        self.relative_position_grid = None if relative_position_grid is None else grid_tuple(relative_position_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.stochastic_depth_rate = float(stochastic_depth_rate)
        policy = self.dtype_policy
        self.attention_norm = make_norm(self.norm, self.layer_norm_epsilon, "LayerNorm_0", policy)
        self.attention = MultiHeadSelfAttention(
            self.num_heads, self.attention_dropout_rate, self.relative_position_grid, self.num_prefix_tokens,
            lora=self.lora, quantization=self.quantization, biases=self.projection_biases,
            name="MultiHeadDotProductAttention_1", dtype=policy)
        self.mlp_norm = make_norm(self.norm, self.layer_norm_epsilon, "LayerNorm_2", policy)
        self.mlp = MlpBlock(self.mlp_dim, self.dropout_rate, self.gelu_approximate, self.mlp_activation,
                            lora=self.lora, quantization=self.quantization, use_bias="mlp" in self.projection_biases,
                            name="MlpBlock_3", dtype=policy)
        scaled = self.layer_scale_init is not None
        self.attention_scale = LayerScale(self.layer_scale_init, name="ls1", dtype=policy) if scaled else None
        self.mlp_scale = LayerScale(self.layer_scale_init, name="ls2", dtype=policy) if scaled else None
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy)
        self.drop_path = StochasticDepth(self.stochastic_depth_rate, dtype=policy)

    def build(self, input_shape):
        for layer in (self.attention_norm, self.attention, self.mlp_norm, self.mlp, self.attention_scale,
                      self.mlp_scale):
            if layer is not None:
                layer.build(input_shape)

    @property
    def seed_generators(self):
        """Every random state the block draws from: attention dropout, the
        MLP's dropout, the dropout after attention, stochastic depth."""
        return seed_generators_of(self.attention, self.mlp, self.dropout, self.drop_path)

    # Set by the trainer (keras_vit.training, TrainConfig.remat) to trade time
    # for memory; not part of the config: it changes no output or gradient.
    rematerialize = False

    def call(self, x, training=False, return_attention_scores=False, rope=None, attention_mask=None):
        """rope: the (cos, sin) of RotaryEmbedding2D for a position_embedding="rope" model;
        attention_mask: (B, N), False on padding tokens (MultiHeadSelfAttention)."""
        if self.rematerialize and training and not return_attention_scores and attention_mask is None:
            return self._rematerialized_call(x, rope)
        return self._residual_branches(x, training, return_attention_scores, rope, attention_mask)

    def _rematerialized_call(self, x, rope=None):
        """The block keeps only its input for the backward pass, which runs
        the block's forward again (keras.remat) instead of holding the
        attention probabilities and MLP activations of every block.

        The recomputation must draw the dropout and stochastic-depth masks
        the forward pass drew, so every random state in the block is rewound
        to where it stood when the forward pass began (Keras' own remat would
        draw new masks, and the gradients would belong to another network).
        The block lists those states itself (`seed_generators`), and a test
        checks the list against every SeedGenerator the block holds.
        """
        states = [generator.state for generator in self.seed_generators]
        start = [state.value for state in states]

        angles = () if rope is None else tuple(rope)

        def forward(x, *inputs):
            rope_now, start_now = (inputs[:2], inputs[2:]) if angles else (None, inputs)
            for state, value in zip(states, start_now):
                state.assign(value)
            return self._residual_branches(x, True, False, rope_now)

        return keras.remat(forward)(x, *angles, *start)

    def _residual_branches(self, x, training, return_attention_scores, rope=None, attention_mask=None):
        y = self.attention_norm(x)
        if return_attention_scores:
            y, scores = self.attention(y, training=training, return_attention_scores=True, rope=rope,
                                       attention_mask=attention_mask)
        else:
            y = self.attention(y, training=training, rope=rope, attention_mask=attention_mask)
        y = self.dropout(y, training=training)
        if self.attention_scale is not None:
            y = self.attention_scale(y)
        x = x + self.drop_path(y, training=training)
        y = self.mlp(self.mlp_norm(x), training=training)
        if self.mlp_scale is not None:
            y = self.mlp_scale(y)
        x = x + self.drop_path(y, training=training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "stochastic_depth_rate": self.stochastic_depth_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "relative_position_grid": (
                None if self.relative_position_grid is None else list(self.relative_position_grid)),
            "num_prefix_tokens": self.num_prefix_tokens,
            **_family_config(self),
        }


def _family_config(layer):
    """The block options added with the ViT family (DINOv2, CLIP), only where they
    differ from the default: older `.keras` files, which lack them, keep loading."""
    config = {}
    if layer.layer_scale_init is not None:
        config["layer_scale_init"] = layer.layer_scale_init
    if layer.mlp_activation != "gelu":
        config["mlp_activation"] = layer.mlp_activation
    if layer.lora:
        config["lora"] = layer.lora
    if layer.quantization:
        config["quantization"] = layer.quantization
    if layer.norm != "layer_norm":
        config["norm"] = layer.norm
    if layer.projection_biases != PROJECTIONS:
        config["projection_biases"] = list(layer.projection_biases)
    return config
