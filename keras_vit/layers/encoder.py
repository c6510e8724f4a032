"""The stack of encoder blocks and the final LayerNorm."""

import keras

from keras_vit.layers.encoder_block import LAYER_NORM_EPSILON, EncoderBlock, _family_config
from keras_vit.config import PROJECTIONS
from keras_vit.layers.lora import check_lora
from keras_vit.layers.normalization import make_norm
from keras_vit.layers.position_embedding_2d import grid_tuple


@keras.saving.register_keras_serializable(package="keras_vit")
class Encoder(keras.layers.Layer):
    """`num_layers` EncoderBlocks followed by LayerNorm ("encoder_norm").

    Stochastic depth grows linearly with depth: block i drops its residual
    branches with probability stochastic_depth_rate * i / (num_layers - 1).

    `call(x, return_attention_scores=True)` returns (tokens, [probabilities
    of block 0, block 1, ...]), each (B, heads, N, N): the same weights and
    code as the plain call, so attention maps cannot drift from the model.
    `return_block_outputs=True` appends [the output of block 0, 1, ...]
    (B, N, D), before the final LayerNorm: (tokens, [scores,] outputs).

    relative_position_grid=(rows, cols) gives every block's attention its
    own RelativePositionBias (position_embedding="relative"), for a grid
    after `num_prefix_tokens` prefix tokens.

    final_norm=False leaves the tokens un-normalised (CLIP normalises the
    pooled vector instead: the model's "pooled_norm").

    lora: {"rank", "alpha", "targets"}: every block's low-rank updates
    (EncoderBlock); None: none.

    quantization: "int8" or "int4": every block's projections are
    quantised (EncoderBlock); None: float.

    norm: "layer_norm" or "rms_norm" (AIMv2): every norm's kind.

    projection_biases: the block projections that have a bias (EncoderBlock).
    """

    def __init__(self, num_layers, num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0,
                 stochastic_depth_rate=0.0, layer_norm_epsilon=LAYER_NORM_EPSILON, gelu_approximate=True,
                 relative_position_grid=None, num_prefix_tokens=0, layer_scale_init=None, mlp_activation="gelu",
                 final_norm=True, lora=None, quantization=None, norm="layer_norm", projection_biases=PROJECTIONS,
                 **kwargs):
        super().__init__(**kwargs)
        self.norm = norm
        self.projection_biases = tuple(name for name in PROJECTIONS if name in projection_biases)
        self.lora = check_lora(lora)
        self.quantization = quantization or None
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        self.mlp_activation = mlp_activation
        self.final_norm = bool(final_norm)
        self.relative_position_grid = None if relative_position_grid is None else grid_tuple(relative_position_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.stochastic_depth_rate = float(stochastic_depth_rate)
        self.blocks = [
            EncoderBlock(
                self.num_heads,
                self.mlp_dim,
                self.dropout_rate,
                self.attention_dropout_rate,
                self.stochastic_depth_rate * i / max(self.num_layers - 1, 1),
                self.layer_norm_epsilon,
                self.gelu_approximate,
                self.relative_position_grid,
                self.num_prefix_tokens,
                self.layer_scale_init,
                self.mlp_activation,
                lora=self.lora,
                quantization=self.quantization,
                norm=self.norm,
                projection_biases=self.projection_biases,
                name=f"encoderblock_{i}",
                dtype=self.dtype_policy,
            )
            for i in range(self.num_layers)
        ]
        self.encoder_norm = make_norm(self.norm, self.layer_norm_epsilon, "encoder_norm",
                                      self.dtype_policy) if self.final_norm else None

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)
        if self.encoder_norm is not None:
            self.encoder_norm.build(input_shape)

    def call(self, x, training=False, return_attention_scores=False, return_block_outputs=False, rope=None,
             attention_mask=None):
        """rope: the (cos, sin) of RotaryEmbedding2D, for every block (position_embedding="rope");
        attention_mask: (B, N), False on padding tokens, for every block."""
        scores, block_outputs = [], []
        masks = {} if attention_mask is None else {"attention_mask": attention_mask}
        for block in self.blocks:
            if return_attention_scores:
                x, block_scores = block(x, training=training, return_attention_scores=True, rope=rope, **masks)
                scores.append(block_scores)
            else:
                x = block(x, training=training, rope=rope, **masks)
            block_outputs.append(x)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        extras = ([scores] if return_attention_scores else []) + ([block_outputs] if return_block_outputs else [])
        return (x, *extras) if extras else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_layers": self.num_layers,
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
            **({} if self.final_norm else {"final_norm": False}),
        }
