"""timm ViT checkpoints (model.safetensors + the config.json of its HF Hub
`timm/NAME` repo), mapped from timm's layout (timm/models/vision_transformer.py):

    cls_token (1, 1, D)                  pos_embed (1, 1 + N, D)
    patch_embed.proj.weight (D, C, p, p) blocks.N.norm1 / norm2 (LayerNorm)
    blocks.N.attn.qkv.weight (3D, D)     fused query/key/value, in that order
    blocks.N.attn.proj                   blocks.N.mlp.fc1 / fc2
    norm (final LayerNorm)               head (classifier), pre_logits.fc (old)

timm's ViT uses the exact GELU (nn.GELU) and LayerNorm eps 1e-6. Layouts
keras-vit's ViT cannot compute are refused by name: hybrids (a ResNet in
patch_embed.backbone), register/distillation tokens, layer scale, QK-norm,
the pre-norm of CLIP towers, average pooling with fc_norm, qkv_bias=False.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Dict, Optional

import numpy as np

from keras_vit.config import ViTConfig
from keras_vit.errors import UserError
from keras_vit.weights.checkpoint import (
    POSEMB_KEY,
    Checkpoint,
    conv_kernel,
    grid_side,
    linear_kernel,
    out_kernel,
    qkv_bias,
    qkv_kernel,
    read_json,
    read_safetensors,
    rename,
)

logger = logging.getLogger("keras_vit")

# The heads of timm's ViT sizes (the size word of its model names).
_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16}

_UNSUPPORTED = (
    ("patch_embed.backbone.", "a hybrid (its ResNet lives in patch_embed.backbone, in timm's own layout); use the "
                              "official R50+B/16, R26+S/32 or R+Ti/16 .npz instead"),
    ("reg_token", "register tokens"),
    ("dist_token", "a distillation token (DeiT)"),
    (".ls1.", "layer scale"),
    (".attn.q_norm.", "QK-norm"),
    ("norm_pre.", "a pre-encoder LayerNorm (CLIP-style)"),
    ("fc_norm.", "average pooling with a LayerNorm after the pooling (fc_norm)"),
    ("attn_pool.", "attention pooling (MAP head)"),
)


def _fused(index, heads, kind):
    """One of q/k/v from timm's fused qkv tensor."""
    def transform(t):
        part = np.split(t, 3, axis=0)[index]
        return qkv_kernel(part, heads) if kind == "kernel" else qkv_bias(part, heads)
    return transform


def params_from_timm(tensors: Dict[str, np.ndarray], config: ViTConfig) -> Dict[str, np.ndarray]:
    """timm tensors -> official layout. The fused qkv is used three times, so it is
    split here first; everything no rule uses keeps its timm name."""
    heads = config.num_heads
    tensors = dict(tensors)
    for i in range(config.num_layers):
        for leaf in ("weight", "bias"):
            fused = tensors.pop(f"blocks.{i}.attn.qkv.{leaf}", None)
            if fused is not None:
                for j, name in enumerate("qkv"):
                    tensors[f"blocks.{i}.attn.{name}.{leaf}"] = _fused(j, heads, "kernel" if leaf == "weight" else
                                                                      "bias")(np.asarray(fused, np.float32))
    table = {
        "cls": ("cls_token", None),
        POSEMB_KEY: ("pos_embed", None),
        "embedding/kernel": ("patch_embed.proj.weight", conv_kernel),
        "embedding/bias": ("patch_embed.proj.bias", None),
        "Transformer/encoder_norm/scale": ("norm.weight", None),
        "Transformer/encoder_norm/bias": ("norm.bias", None),
        "pre_logits/kernel": ("pre_logits.fc.weight", linear_kernel),
        "pre_logits/bias": ("pre_logits.fc.bias", None),
        "head/kernel": ("head.weight", linear_kernel),
        "head/bias": ("head.bias", None),
    }
    for i in range(config.num_layers):
        b, o = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        a = o + "MultiHeadDotProductAttention_1/"
        for name, short in (("query", "q"), ("key", "k"), ("value", "v")):
            table[a + name + "/kernel"] = (f"{b}attn.{short}.weight", None)  # already split and reshaped
            table[a + name + "/bias"] = (f"{b}attn.{short}.bias", None)
        table[a + "out/kernel"] = (b + "attn.proj.weight", lambda w: out_kernel(w, heads))
        table[a + "out/bias"] = (b + "attn.proj.bias", None)
        for ours, theirs in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            table[o + ours + "/scale"] = (f"{b}{theirs}.weight", None)
            table[o + ours + "/bias"] = (f"{b}{theirs}.bias", None)
        for ours, theirs in (("Dense_0", "mlp.fc1"), ("Dense_1", "mlp.fc2")):
            table[o + f"MlpBlock_3/{ours}/kernel"] = (f"{b}{theirs}.weight", linear_kernel)
            table[o + f"MlpBlock_3/{ours}/bias"] = (f"{b}{theirs}.bias", None)
    return rename(tensors, table)


def _num_heads(architecture: Optional[str], width: int, depth: int, mlp: int, where: str) -> int:
    if architecture:
        for word in re.split(r"[_.]", architecture):
            if word in _HEADS:
                return _HEADS[word]
    from keras_vit.variants import VARIANTS

    for config in VARIANTS.values():
        if (config.hidden_size, config.num_layers, config.mlp_dim) == (width, depth, mlp):
            return config.num_heads
    raise UserError(f"{where}: cannot tell the number of attention heads of a width-{width}, depth-{depth} timm "
                    f"ViT (its architecture name is {architecture!r}); put timm's config.json (with "
                    f"'architecture') next to model.safetensors.")


def read_timm(weights_path, config_path=None, source=None) -> Checkpoint:
    """A timm ViT model.safetensors (+ its config.json) as a Checkpoint."""
    weights_path = os.fspath(weights_path)
    where = source or weights_path
    if not os.path.isfile(weights_path):
        raise UserError(f"{where}: no timm weights file {weights_path!r} (timm repos hold model.safetensors; "
                        f"keras-vit never reads pytorch_model.bin pickles).")
    timm_config = read_json(config_path) if config_path else {}
    architecture = timm_config.get("architecture")
    tensors = read_safetensors(weights_path)
    for marker, what in _UNSUPPORTED:
        if any(marker in key or key.startswith(marker) for key in tensors):
            raise UserError(f"{where} ({architecture or 'timm ViT'}) has {what}, which keras-vit's ViT does not "
                            f"compute; it cannot be loaded without changing its outputs.")
    if "patch_embed.proj.weight" not in tensors or "blocks.0.attn.qkv.weight" not in tensors:
        if "blocks.0.attn.proj.weight" in tensors:
            raise UserError(f"{where} has no fused qkv tensor (blocks.0.attn.qkv.weight); not a timm ViT layout "
                            f"keras-vit maps.")
        raise UserError(f"{where} is not a timm VisionTransformer checkpoint (no patch_embed.proj.weight / "
                        f"blocks.0.attn.qkv.weight).")
    if "blocks.0.attn.qkv.bias" not in tensors:
        raise UserError(f"{where} was built with qkv_bias=False: keras-vit's attention always has query/key/"
                        f"value biases, so this layout cannot be expressed.")
    has_cls = "cls_token" in tensors
    # "" (no pooling: a feature extractor) reads like the model's own pooling.
    pool = timm_config.get("global_pool") or ("token" if has_cls else "avg")
    if pool not in ("token", "avg", "") or (pool == "token") != has_cls:
        raise UserError(f"{where} pools with global_pool={pool!r} {'with' if has_cls else 'without'} a class "
                        f"token; keras-vit reads the class token or averages a model without one.")
    proj = tensors["patch_embed.proj.weight"]  # (D, C, p, p)
    width, channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[2])
    depth = len({int(m.group(1)) for k in tensors for m in [re.match(r"blocks\.(\d+)\.", k)] if m})
    mlp = int(tensors["blocks.0.mlp.fc1.weight"].shape[0])
    config = ViTConfig(
        patch_size=patch, hidden_size=width, mlp_dim=mlp, num_heads=_num_heads(architecture, width, depth, mlp, where),
        num_layers=depth, classifier="token" if has_cls else "gap",
        representation_size=int(tensors["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in tensors else None,
        layer_norm_epsilon=1e-6, gelu_approximate=False,
    )
    grid_tokens = tensors["pos_embed"].shape[1] - has_cls
    pretrained = timm_config.get("pretrained_cfg", {})
    if "input_size" in pretrained:
        image_size = (int(pretrained["input_size"][1]), int(pretrained["input_size"][2]))
        if (image_size[0] // patch) * (image_size[1] // patch) != grid_tokens:
            raise UserError(f"{where}: pos_embed has {grid_tokens} grid tokens, which is not the "
                            f"{image_size} input of its config; is it a no_embed_class model? (not supported)")
    else:
        side = grid_side(grid_tokens, where) * patch
        image_size = (side, side)
    mean, std = pretrained.get("mean"), pretrained.get("std")
    if mean is not None and (not np.allclose(mean, 0.5) or not np.allclose(std, 0.5)):
        logger.warning("keras_vit: %s expects inputs normalised with mean %s and std %s, not the [-1, 1] "
                       "scaling of keras_vit.preprocess_input: normalise images that way yourself.", where, mean, std)
    labels = timm_config.get("label_names")
    params = params_from_timm(tensors, config)
    head = params.get("head/kernel")
    if labels is not None and (head is None or len(labels) != head.shape[-1]):
        labels = None
    return Checkpoint(config=config, params=params, image_size=image_size, labels=labels, source=where,
                      num_channels=channels)
