"""The layers a ViT is assembled from, one module each."""

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.class_token import ClassToken
from keras_vit.layers.dense_heads import DPTHead, LinearHead, ResidualConvUnit
from keras_vit.layers.encoder import Encoder
from keras_vit.layers.feature_map import TokensToMap
from keras_vit.layers.grid_resize import PadToMultiple
from keras_vit.layers.heads import AttentionPoolingHead, DistillationHead, MAPHead
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.lora import DEFAULT_LORA_TARGETS, LORA_TARGETS, LowRankUpdate
from keras_vit.layers.encoder_block import LAYER_NORM_EPSILON, EncoderBlock
from keras_vit.layers.mlp import MlpBlock
from keras_vit.layers.normalization import NORMS, RMSNorm, make_norm
from keras_vit.layers.patch_corruption import PatchCorruption
from keras_vit.layers.patch_dropout import PatchDropout
from keras_vit.layers.patch_embedding import PatchEmbedding
from keras_vit.layers.pooling import TokenPooling
from keras_vit.layers.position_embedding import PositionEmbedding
from keras_vit.layers.position_embedding_2d import PositionEmbedding2D
from keras_vit.layers.relative_position_bias import RelativePositionBias
from keras_vit.layers.resnet import BottleneckUnit, ResNetStem
from keras_vit.layers.rotary import RotaryEmbedding2D
from keras_vit.layers.sincos_position_embedding import SinCosPositionEmbedding2D, sincos_2d_table
from keras_vit.layers.std_conv import StdConv2D
from keras_vit.layers.stochastic_depth import StochasticDepth
from keras_vit.layers.tokens import InsertTokens

__all__ = [
    "AttentionPoolingHead",
    "DPTHead",
    "LinearHead",
    "ResidualConvUnit",
    "NORMS",
    "RMSNorm",
    "make_norm",
    "PatchDropout",
    "BottleneckUnit",
    "ClassToken",
    "DistillationHead",
    "InsertTokens",
    "LayerScale",
    "LowRankUpdate",
    "LORA_TARGETS",
    "DEFAULT_LORA_TARGETS",
    "MAPHead",
    "Encoder",
    "EncoderBlock",
    "LAYER_NORM_EPSILON",
    "MlpBlock",
    "MultiHeadSelfAttention",
    "PadToMultiple",
    "PatchCorruption",
    "PatchEmbedding",
    "PositionEmbedding",
    "PositionEmbedding2D",
    "RelativePositionBias",
    "ResNetStem",
    "SinCosPositionEmbedding2D",
    "StdConv2D",
    "StochasticDepth",
    "TokenPooling",
    "TokensToMap",
    "sincos_2d_table",
]
