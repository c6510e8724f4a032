"""The one table of ViT variant sizes (the paper's Table 1, plus Ti/S from AugReg).

Everything else (the `ViT_B16`-style constructors, the checkpoint names, the
tests' parameter counts) is keyed by these names and never repeats the sizes.
A hybrid's patch size is 1 on the ResNet feature map; its name gives the total
stride ("R50+B/16": 16 pixels per token side). The exception is vit_jax's own
name for R+Ti/16: its ResNet is the root block alone (stride 4) under 8x8
patches, 32 pixels per token side (timm: vit_tiny_r_s16_p8), under the name
of its AugReg checkpoint.
"""

from __future__ import annotations

import difflib
from typing import Dict, List

from keras_vit.config import ResNetConfig, ViTConfig
from keras_vit.errors import UserError

#            width  depth  heads  mlp
_SIZES = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
    # SigLIP's shape-optimised 400M (Alabdulmohsin et al. 2023), SigLIP2's largest NaFlex tower
    "So400m": (1152, 27, 16, 4304),
    # AIMv2's large tower (apple/aimv2-large-patch14-224): L's width and depth, 8 heads, a gated MLP of 2816
    "AIMv2-L": (1024, 24, 8, 2816),
    "Mu": (128, 4, 4, 256),  # micro: the CPU demo (MNIST), not from the paper
    # nano: one block, a run of a few steps in seconds, to try a command, data or recipe before
    # the real run (and the suite's command-line tests); not from the paper, learns little
    "Nano": (32, 1, 2, 64),
}


# What each descendant changes in the paper's ViT (ViTConfig's fields), with the
# numerics of its transformers checkpoints (LayerNorm eps, GELU form).
_FAMILIES = {
    "DeiT": dict(distillation_token=True, distillation_head=True, layer_norm_epsilon=1e-12, gelu_approximate=False,
                 position_interpolation="bicubic", pixel_normalization="imagenet"),
    "DINOv2": dict(layer_scale_init=1.0, gelu_approximate=False, position_interpolation="bicubic",
                   pixel_normalization="imagenet"),
    "DINOv2-reg": dict(layer_scale_init=1.0, gelu_approximate=False, num_register_tokens=4,
                       position_interpolation="bicubic_antialias", pixel_normalization="imagenet"),
    "DINOv3": dict(layer_scale_init=1.0, gelu_approximate=False, num_register_tokens=4, position_embedding="rope",
                   layer_norm_epsilon=1e-5, pixel_normalization="imagenet"),
    "SigLIP": dict(classifier="map", position_interpolation="bicubic"),
    # NaFlex: the table (16 x 16 in the published towers: build at 256 px for 16 px patches) is
    # resized to each image's own grid (keras_vit.model.naflex).
    "SigLIP2": dict(classifier="map", position_interpolation="bilinear_antialias"),
    # RMSNorm everywhere (and after the patch embedding), a gated MLP, no projection biases, its own
    # attention pooling; the pixels of CLIP.
    "AIMv2": dict(classifier="attention_pool", norm="rms_norm", patch_norm=True, mlp_activation="swiglu",
                  projection_biases=(), layer_norm_epsilon=1e-5, gelu_approximate=False,
                  position_interpolation="bicubic", pixel_normalization="clip"),
    "CLIP": dict(pre_norm=True, final_norm="pooled", patch_bias=False, mlp_activation="quick_gelu",
                 layer_norm_epsilon=1e-5, position_interpolation="bicubic", pixel_normalization="clip"),
}


def _vit(size: str, patch_size: int, resnet: ResNetConfig = None, family: str = None, **fields) -> ViTConfig:
    hidden_size, num_layers, num_heads, mlp_dim = _SIZES[size]
    return ViTConfig(
        patch_size=patch_size,
        hidden_size=hidden_size,
        mlp_dim=mlp_dim,
        num_heads=num_heads,
        num_layers=num_layers,
        resnet=resnet,
        **(_FAMILIES[family] if family else {}),
        **fields,
    )


VARIANTS: Dict[str, ViTConfig] = {
    "Ti/16": _vit("Ti", 16),
    "S/16": _vit("S", 16),
    "S/32": _vit("S", 32),
    "B/8": _vit("B", 8),
    "B/16": _vit("B", 16),
    "B/32": _vit("B", 32),
    "L/16": _vit("L", 16),
    "L/32": _vit("L", 32),
    "H/14": _vit("H", 14),
    "Mu/4": _vit("Mu", 4),
    "Nano/4": _vit("Nano", 4),
    # Hybrids: the ResNet reaches stride 16 with 3 stages, 32 with 4.
    "R50+B/16": _vit("B", 1, ResNetConfig(num_layers=(3, 4, 9))),
    "R26+S/32": _vit("S", 1, ResNetConfig(num_layers=(2, 2, 2, 2))),
    "R50+L/32": _vit("L", 1, ResNetConfig(num_layers=(3, 4, 6, 3))),
    "R26+B/32": _vit("B", 1, ResNetConfig(num_layers=(2, 2, 2, 2))),
    # vit_jax's R_Ti_16: the root block only, then 8x8 patches (see the module docstring).
    "R+Ti/16": _vit("Ti", 8, ResNetConfig(num_layers=())),
    # The descendants (their transformers checkpoints load with keras_vit.from_pretrained).
    "DeiT-Ti/16": _vit("Ti", 16, family="DeiT"),
    "DeiT-S/16": _vit("S", 16, family="DeiT"),
    "DeiT-B/16": _vit("B", 16, family="DeiT"),
    "DINOv2-S/14": _vit("S", 14, family="DINOv2"),
    "DINOv2-B/14": _vit("B", 14, family="DINOv2"),
    "DINOv2-L/14": _vit("L", 14, family="DINOv2"),
    "DINOv2-reg-S/14": _vit("S", 14, family="DINOv2-reg"),
    "DINOv2-reg-B/14": _vit("B", 14, family="DINOv2-reg"),
    # DINOv3's ViTs (facebook/dinov3-vit{s,b,l}16-pretrain-lvd1689m): rotary positions, 4 registers.
    "DINOv3-S/16": _vit("S", 16, family="DINOv3"),
    "DINOv3-B/16": _vit("B", 16, family="DINOv3"),
    "DINOv3-L/16": _vit("L", 16, family="DINOv3"),
    "SigLIP-B/16": _vit("B", 16, family="SigLIP"),
    # SigLIP2's NaFlex towers (google/siglip2-base-patch16-naflex, google/siglip2-so400m-patch16-naflex).
    "SigLIP2-B/16": _vit("B", 16, family="SigLIP2"),
    "SigLIP2-So400m/16": _vit("So400m", 16, family="SigLIP2"),
    # AIMv2's large image tower (apple/aimv2-large-patch14-224; -native: position_embedding="sincos_2d").
    "AIMv2-L/14": _vit("AIMv2-L", 14, family="AIMv2"),
    "CLIP-B/32": _vit("B", 32, family="CLIP", projection_size=512),
    "CLIP-B/16": _vit("B", 16, family="CLIP", projection_size=512),
    "CLIP-L/14": _vit("L", 14, family="CLIP", projection_size=768),
    # MetaCLIP 2's worldwide H/14 (facebook/metaclip-2-worldwide-huge-quickgelu): CLIP's architecture.
    "MetaCLIP2-H/14": _vit("H", 14, family="CLIP", projection_size=1024),
}
"""Every named size: variant name -> ViTConfig (`keras-vit variants` prints them). Hybrids are
"R50+B/16"-style names; "Mu/4" is the micro model of the demo, "Nano/4" a one-block model to try
a command or a dataset in seconds."""


def _normalise(name: str) -> str:
    # Accept "B/16", "b16", "ViT-B/16", "ViT-B_16", "R50+ViT-B/16", "R50+B_16".
    key = name.strip().upper().replace("VIT-", "").replace("VIT_", "").replace("_", "/")
    key = key.replace("-", "/")
    if "/" not in key:
        head = key.rstrip("0123456789")
        key = f"{head}/{key[len(head):]}"
    return key


def get_variant(name: str) -> ViTConfig:
    """The architecture of a named variant, e.g. "B/16" or "R50+B/16"."""
    if isinstance(name, ViTConfig):
        return name
    wanted = _normalise(str(name))
    for variant, config in VARIANTS.items():
        if _normalise(variant) == wanted:
            return config
    # A short line: the first few names, a close match if any, and where the whole list is.
    close = difflib.get_close_matches(str(name), list(VARIANTS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UserError(
        f"Unknown ViT variant {name!r}{hint}. Known variants: {', '.join(list(VARIANTS)[:_SHOWN])} and "
        f"{len(VARIANTS) - _SHOWN} more (keras_vit.list_variants(), or `keras-vit variants`)."
    )


_SHOWN = 10  # variant names an unknown-variant message lists


def canonical_name(name_or_config) -> str:
    """The table's spelling of a variant ("vit-b_16" -> "B/16").

    A ViTConfig is matched on its architecture (sizes, patch, ResNet), so a
    B/16 with a representation layer or dropout is still "B/16".
    """
    if not isinstance(name_or_config, ViTConfig):
        config = get_variant(name_or_config)
        return next(k for k, v in VARIANTS.items() if v is config)
    for variant, config in VARIANTS.items():
        if _architecture(config) == _architecture(name_or_config):
            return variant
    raise UserError(f"{name_or_config} is not one of the registered variants {list(VARIANTS)}.")


def _architecture(config: ViTConfig):
    """What makes a variant: sizes, stem, and the backbone's family traits (not its
    head, dropout or numerics: a DINOv2 classifier is still DINOv2-S/14)."""
    return (config.patch_size, config.hidden_size, config.mlp_dim, config.num_heads, config.num_layers,
            config.resnet, config.distillation_token, config.num_register_tokens,
            config.layer_scale_init is not None, config.mlp_activation, config.pre_norm, config.final_norm,
            config.classifier == "map", config.position_embedding == "rope",
            config.position_interpolation == "bilinear_antialias",  # SigLIP2's NaFlex table
            config.classifier == "attention_pool", config.norm, config.patch_norm, config.projection_biases)


def list_variants() -> List[str]:
    """Names of every registered variant, smallest first within each family."""
    return list(VARIANTS)
