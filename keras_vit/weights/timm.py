"""timm ViT checkpoints (model.safetensors + the config.json of its HF Hub
`timm/NAME` repo), mapped from timm's layout (timm/models/vision_transformer.py
VisionTransformer, timm/models/deit.py VisionTransformerDistilled):

    cls_token (1, 1, D)   dist_token (1, 1, D)   reg_token (1, R, D)
    pos_embed (1, [prefix +] N, D)               patch_embed.proj (D, C, p, p) [+ bias]
    norm_pre (CLIP)       blocks.N.norm1 / norm2 (LayerNorm)
    blocks.N.attn.qkv.weight (3D, D)             fused query/key/value, in that order
    blocks.N.attn.proj    blocks.N.ls1.gamma / ls2.gamma (layer scale)
    blocks.N.mlp.fc1 / fc2                       fc1 twice fc2's width: SwiGLUPacked
    norm (on every token) or fc_norm (on the pooled vector)
    attn_pool.latent / q / kv / proj / norm / mlp.fc1 / mlp.fc2 (global_pool="map")
    head, head_dist (DeiT distilled), pre_logits.fc (old)

Each layout is computed exactly as timm does:

- DeiT distilled: a distillation token after the class token, both with a row
  of pos_embed; logits the mean of head(class) and head_dist(distillation)
  (VisionTransformerDistilled.forward_head in eval). Non-distilled DeiT is
  the plain layout.
- DINOv2: layer scale (ls1/ls2.gamma); pos_embed has the class token's row.
  With registers (vit_*_reg4_dinov2, no_embed_class=True) pos_embed covers
  the patches only: timm's _convert_dinov2 folded the class row into
  cls_token, and neither class token nor registers get a position
  (VisionTransformer._pos_embed). keras-vit adds positions to the class
  token and patches, then inserts the registers, so an unpositioned class or
  distillation token reads as a zero row of our table; a model whose
  pos_embed does have rows for its registers (no_embed_class=False) gets
  each row added to its register once, here, since timm adds it unchanged.
- SwiGLU: DINOv2 giant's SwiGLUPacked (GluMlp, gate_last=False) holds
  [gate; value] in one fc1 and computes silu(gate) * value: our Dense_0 as
  is. A packed fc1 is known to be that only by timm's architecture name.
- SigLIP (global_pool="map"): AttentionPoolLatent with one latent (the
  probe), q on it, kv split into key then value, each heads-major as the
  blocks' qkv; proj, norm, then a residual MLP of the blocks' width and
  activation: classifier "map".
- CLIP towers: norm_pre, no patch bias, LayerNorm eps 1e-5 (every *_clip_*
  builder), the final norm on all tokens ("tokens"; the class token's is
  CLIP's pooled norm), and a head with an all-zero bias (how timm stores
  CLIP's visual projection: checkpoint_filter_fn) read as the bias-free
  projection; a head with a bias is a classifier.
- fc_norm (average pooling's LayerNorm after the pooling): final_norm="pooled".
- global_pool="avg" with a class token: the mean of the patch tokens, the class
  token attending but not read (classifier "gap", class_token=True).
- DINOv3 (timm/models/eva.py, Eva with rope_type='dinov3'): no pos_embed but
  rotary positions, computed as transformers' and keras-vit's (patch centres
  in [-1, 1] per axis, the half-split rotation, temperature 100); one qkv
  without a bias, or q_bias / v_bias beside it on the _qkvb builders (the key
  bias is a zero buffer, never saved); gamma_1 / gamma_2 as layer scale;
  SwiGLU's fc1_g / fc1_x (S+, H+, 7B); LayerNorm eps 1e-5; registers; pooled
  by the mean of the patch tokens unless global_pool="token".
- AIMv2 (aimv2_*): RmsNorm (eps 1e-5) everywhere and on the patch
  embeddings (patch_embed.norm), SwiGLU, no qkv / proj / MLP biases, no class
  token, the mean of every token after the final norm.
- qkv_bias=False, proj_bias=False or an MLP without biases on any timm ViT:
  ViTConfig.projection_biases; a patch-embedding norm: patch_norm.

What the tensors cannot say is read from timm's architecture name (the
"architecture" of config.json) as its builders set it: the activation
(act_layer="gelu_tanh" in the builders listed in _GELU_TANH, QuickGELU in
*_clip_quickgelu_*, exact GELU otherwise: timm's CLIP towers without
"quickgelu" compute exact GELU even on OpenAI weights, and so does keras-vit),
CLIP's eps, the heads; a config.json "model_args" (timm's create_model
kwargs) overrides act_layer and num_heads as timm does.

These family checkpoints resize their position table as timm's
resample_abs_pos_embed does (bicubic, antialias=True, only the grid rows):
position_interpolation="bicubic_antialias"; and take the pixel
normalisation of their pretrained_cfg mean/std when it is ImageNet's, CLIP's
or 0.5's. A plain timm ViT keeps the official linear resize and only warns
about a mean/std other than 0.5.

Refused by name, as keras-vit's ViT cannot compute them: hybrids (a ResNet
in patch_embed.backbone), QK-norm, norms inside attention or MLP
(scale_attn_norm / scale_mlp_norm), differential or gated attention,
the other Eva-class models (EVA-01/02, RoPE-ViT, Perception Encoder), norms without a bias that the architecture does not
name RMSNorm, a head_dim other than width / heads, a MAP head that would read prefix tokens
differently, fc_norm with a MAP head or a distillation head, global pools
other than token / avg / map, a distilled model without heads (timm's
features average two tokens), a gated MLP of an architecture not known to
be SwiGLU, a model without a final norm.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

import numpy as np

from keras_vit.utils import console as _console
from keras_vit.config import ViTConfig
from keras_vit.errors import UserError
from keras_vit.weights.checkpoint import (
    CONV,
    POSEMB_KEY,
    Checkpoint,
    activation,
    grid_side,
    read_json,
    read_safetensors,
    rename,
    torch_block,
    torch_dense,
    torch_map_head,
    torch_norm,
)
from keras_vit.weights.layout import ENCODER_NORM, PATCH_NORM


# The heads of timm's ViT sizes (the size word of its model names).
_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16, "gigantic": 16,
          "so400m": 16, "giantopt": 16, "betwixt": 10, "xsmall": 4, "so150m": 14, "so150m2": 13, "mediumd": 8,
          "wee": 4, "little": 5}
# Size words whose heads depend on the width (timm's builders): ViT-B/16+ (CLIP) is 896 wide with
# 14 heads; "giant" is 1408 wide with 16 heads (CLIP) or 1536 with 24 (DINOv2).
_HEADS_BY_WIDTH = {("base", 896): 14, ("giant", 1408): 16, ("giant", 1536): 24}
# Builders whose heads no size word gives: DINOv3's H+ and 7B (timm/models/eva.py) and AIMv2's
# (vision_transformer.py: aimv2_large is 1024 wide with 8 heads, not ViT-L's 16).
_HEADS_BY_NAME = {"vit_huge_plus_patch16_dinov3": 20, "vit_7b_patch16_dinov3": 32,
                  **{f"aimv2_{size}_patch14_{px}": heads for size, heads in (("large", 8), ("huge", 12), ("1b", 16),
                                                                              ("3b", 24))
                     for px in (224, 336, 448)}}

# timm's builders with act_layer='gelu_tanh' (timm/models/vision_transformer.py); every other
# VisionTransformer uses nn.GELU (exact), and *_clip_quickgelu_* QuickGELU.
_GELU_TANH = frozenset({
    "vit_base_patch32_siglip_256", "vit_large_patch16_siglip_512", "vit_so400m_patch16_siglip_256",
    "vit_so400m_patch16_siglip_384", "vit_so400m_patch16_siglip_512", "vit_giantopt_patch16_siglip_256",
    "vit_giantopt_patch16_siglip_384", "vit_base_patch32_siglip_gap_256", "vit_large_patch16_siglip_gap_512",
    "vit_so400m_patch16_siglip_gap_256", "vit_so400m_patch16_siglip_gap_384", "vit_so400m_patch16_siglip_gap_512",
    "vit_giantopt_patch16_siglip_gap_256", "vit_giantopt_patch16_siglip_gap_384",
})
# timm's builders with mlp_layer=SwiGLUPacked and act_layer=nn.SiLU: fc1 is [gate; value].
_SWIGLU_PACKED = frozenset({"vit_giant_patch14_dinov2", "vit_giant_patch14_reg4_dinov2",
                            "vit_giant_patch14_reg1_tipsv2"})
# Architecture names of the families whose resize and pixels follow timm (non-distilled DeiT
# and SigLIP with average pooling have the plain layout).
_FAMILY_NAME = re.compile(r"^deit|dinov2|dinov3|siglip|_clip_|^aimv2_")
# DINOv3's builders (timm/models/eva.py, Eva with rope_type='dinov3'): rotary positions and no table,
# LayerNorm eps 1e-5, average pooling of the patch tokens by default (global_pool='avg').
_DINOV3 = re.compile(r"^vit_\w+_dinov3")
# Other rotary-position builders (EVA-02, naver's RoPE-ViT, Perception Encoder) and Eva's own names.
_OTHER_ROPE = re.compile(r"^eva|_rope_|^vit_pe_")
_EVA_KEY = re.compile(r"^blocks\.\d+\.(gamma_[12]|attn\.[qv]_bias)$")

_UNSUPPORTED = (
    ("patch_embed.backbone.", "a hybrid (its ResNet lives in patch_embed.backbone, in timm's own layout); use the "
                              "official R50+B/16, R26+S/32 or R+Ti/16 .npz instead"),
    (".attn.q_norm.", "QK-norm"),
    (".attn.k_norm.", "QK-norm"),
    ("attn_pool.q_norm.", "QK-norm in its attention pooling"),
    (".attn.norm.", "a norm inside the attention (scale_attn_norm)"),
    (".mlp.norm.", "a norm inside the MLP (scale_mlp_norm)"),
    (".attn.lambda_", "differential attention (attn_layer='diff')"),
    (".attn.gate.", "gated attention"),
    ("attn_pool.pos_embed", "a position embedding inside its attention pooling"),
)


# timm's Block names for our parts (layout.BLOCK_PARTS); q, k and v as _unfuse leaves them.
_BLOCK = dict(query="attn.q", key="attn.k", value="attn.v", out="attn.proj", norm1="norm1", norm2="norm2",
              fc1="mlp.fc1", fc2="mlp.fc2", ls1="ls1.gamma", ls2="ls2.gamma")
# AttentionPoolLatent's names for the MAP head's parts (layout.MAP_PARTS): the latent is the
# probe, q acts on it, kv is key then value (split by _unfuse).
_ATTENTION_POOL = dict(probe="latent", query="q", key="k", value="v", out="proj", norm="norm", fc1="mlp.fc1",
                       fc2="mlp.fc2")


def _unfuse(tensors: Dict[str, np.ndarray], fused: str, names) -> None:
    """Splits timm's fused Linear `fused` (qkv: thirds; kv: halves of its rows, in that
    order) into one Linear per name beside it, as torch tensors."""
    root = fused.rsplit(".", 1)[0]
    for leaf in ("weight", "bias"):
        packed = tensors.pop(f"{fused}.{leaf}", None)
        if packed is not None:
            for name, part in zip(names, np.split(np.asarray(packed, np.float32), len(names), axis=0)):
                tensors[f"{root}.{name}.{leaf}"] = part


def params_from_timm(tensors: Dict[str, np.ndarray], config: ViTConfig) -> Dict[str, np.ndarray]:
    """timm tensors (already in our token layout, see _tokens) -> official layout; everything
    no rule uses keeps its timm name."""
    heads = config.num_heads
    tensors = dict(tensors)
    for i in range(config.num_layers):
        _unfuse(tensors, f"blocks.{i}.attn.qkv", "qkv")
        for leaf in ("weight", "bias"):
            g, x = tensors.pop(f"blocks.{i}.mlp.fc1_g.{leaf}", None), tensors.pop(f"blocks.{i}.mlp.fc1_x.{leaf}", None)
            if g is not None and x is not None:  # timm's SwiGLU: silu(fc1_g) * fc1_x -> [gate; value]
                tensors[f"blocks.{i}.mlp.fc1.{leaf}"] = np.concatenate([g, x], axis=0)
    table = {
        "cls": ("cls_token", None),
        "dist_token": ("dist_token", None),
        "reg_tokens": ("reg_token", None),
        POSEMB_KEY: ("pos_embed", None),
    }
    torch_dense(table, "embedding", "patch_embed.proj", kernel=CONV)
    torch_norm(table, PATCH_NORM, "patch_embed.norm")
    torch_norm(table, "pre_norm", "norm_pre")
    for i in range(config.num_layers):
        torch_block(table, i, f"blocks.{i}.", _BLOCK, heads)
    torch_norm(table, ENCODER_NORM, "norm")
    torch_norm(table, "pooled_norm", "fc_norm")
    torch_dense(table, "pre_logits", "pre_logits.fc")
    torch_dense(table, "head", "head")
    torch_dense(table, "head_dist", "head_dist")
    torch_dense(table, "projection", "projection", bias=False)  # a CLIP head without bias (see read_timm)
    if "attn_pool.latent" in tensors:
        _attention_pool(tensors, config)
        torch_map_head(table, "attn_pool.", _ATTENTION_POOL, heads)
    return rename(tensors, table)


def _attention_pool(tensors: Dict[str, np.ndarray], config: ViTConfig) -> None:
    """AttentionPoolLatent's kv as key and value; with q_proj=False the latent is the query
    itself: an identity projection."""
    _unfuse(tensors, "attn_pool.kv", ("k", "v"))
    if "attn_pool.q.weight" not in tensors:
        width = config.hidden_size
        tensors["attn_pool.q.weight"] = np.eye(width, dtype=np.float32)
        tensors["attn_pool.q.bias"] = np.zeros(width, np.float32)


def _num_heads(architecture: Optional[str], model_args: dict, width: int, depth: int, mlp: int, where: str) -> int:
    if model_args.get("num_heads"):
        return int(model_args["num_heads"])
    builder = (architecture or "").replace("_qkvb", "")  # the _qkvb builders have their base's sizes
    if builder in _HEADS_BY_NAME:
        return _HEADS_BY_NAME[builder]
    if architecture:
        words = re.split(r"[_.]", architecture)
        for word in words:
            if (word, width) in _HEADS_BY_WIDTH:
                return _HEADS_BY_WIDTH[(word, width)]
        for word in words:
            if word in _HEADS and not width % _HEADS[word]:
                return _HEADS[word]
    from keras_vit.variants import VARIANTS

    for config in VARIANTS.values():
        if (config.hidden_size, config.num_layers, config.mlp_dim) == (width, depth, mlp):
            return config.num_heads
    raise UserError(f"{where}: cannot tell the number of attention heads of a width-{width}, depth-{depth} timm "
                    f"ViT (its architecture name is {architecture!r}); put timm's config.json (with "
                    f"'architecture') next to model.safetensors.")


def _refuse(where: str, architecture: Optional[str], what: str) -> UserError:
    return UserError(f"{where} ({architecture or 'timm ViT'}) has {what}, which keras-vit's ViT does not compute; "
                     f"it cannot be loaded without changing its outputs.")


def _activation(architecture: str, model_args: dict, where: str) -> Tuple[str, bool]:
    """timm's act_layer: config.json's model_args, else the builder's (by the architecture name)."""
    act = model_args.get("act_layer")
    if act is not None:
        return activation(act, "act_layer", where)
    if architecture in _GELU_TANH:
        return "gelu", True
    if "_clip_quickgelu_" in architecture:
        return "quick_gelu", False
    return "gelu", False


def _check_layout(tensors: Dict[str, np.ndarray], architecture: Optional[str], rope: bool, where: str) -> None:
    for marker, what in _UNSUPPORTED:
        if any(marker in key or key.startswith(marker) for key in tensors):
            raise _refuse(where, architecture, what)
    if "patch_embed.proj.weight" not in tensors or "blocks.0.attn.qkv.weight" not in tensors:
        if "blocks.0.attn.proj.weight" in tensors:
            raise UserError(f"{where} has no fused qkv tensor (blocks.0.attn.qkv.weight); not a timm ViT layout "
                            f"keras-vit maps.")
        raise UserError(f"{where} is not a timm VisionTransformer checkpoint (no patch_embed.proj.weight / "
                        f"blocks.0.attn.qkv.weight).")
    width = int(tensors["patch_embed.proj.weight"].shape[0])
    if tuple(tensors["blocks.0.attn.qkv.weight"].shape) != (3 * width, width):
        raise _refuse(where, architecture, f"attention {tensors['blocks.0.attn.qkv.weight'].shape[0] // 3} wide in "
                                           f"a {width}-wide model (a head_dim other than width / heads)")
    if "pos_embed" not in tensors and not rope:
        raise _refuse(where, architecture, "no position embedding (pos_embed='none'; a DINOv3 with rotary positions "
                                           "is known by the architecture of timm's config.json: put it next to "
                                           "model.safetensors)")


def _eva_tensors(tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """timm's Eva names (DINOv3) as VisionTransformer's: gamma_1 / gamma_2 are the layer scales,
    and q_bias / v_bias (the _qkvb builders) one qkv bias with a zero key third. timm's key
    bias is a zero buffer, not saved; a zero key bias computes nothing anyway (it adds q.b to
    every logit of a query alike, which the softmax ignores)."""
    out = {}
    for key, value in tensors.items():
        if key.startswith("rope."):  # buffers a converted file may keep (Meta's bfloat16 periods): recomputed
            continue
        for eva, ours in ((".gamma_1", ".ls1.gamma"), (".gamma_2", ".ls2.gamma")):
            if key.startswith("blocks.") and key.endswith(eva):
                key = key[:-len(eva)] + ours
        out[key] = value
    for key in [k for k in out if k.endswith(".attn.q_bias")]:
        root = key[:-len("q_bias")]
        value = out.pop(root + "v_bias", None)
        if value is not None:
            query = out.pop(key)
            out[root + "qkv.bias"] = np.concatenate([query, np.zeros_like(query), value])
    return out


def _projection_biases(tensors: Dict[str, np.ndarray], architecture: Optional[str], where: str) -> Tuple[str, ...]:
    """Which of the blocks' projections have a bias: timm's qkv_bias, proj_bias and the MLP's."""
    fc1 = "blocks.0.mlp.fc1_g.bias" if "blocks.0.mlp.fc1_g.weight" in tensors else "blocks.0.mlp.fc1.bias"
    if (fc1 in tensors) != ("blocks.0.mlp.fc2.bias" in tensors):
        raise _refuse(where, architecture, "an MLP with a bias in one of its two layers only")
    biases = [name for name, key in (("query", "qkv"), ("key", "qkv"), ("value", "qkv"), ("out", "proj"))
              if f"blocks.0.attn.{key}.bias" in tensors]
    return tuple(biases) + (("mlp",) if fc1 in tensors else ())


def _norm_kind(tensors: Dict[str, np.ndarray], architecture: str, model_args: dict, where: str) -> str:
    """LayerNorm, or RMSNorm where timm's builder (AIMv2) or model_args say so: a LayerNorm
    without bias still subtracts the mean, so a missing bias alone says nothing."""
    norm_layer = model_args.get("norm_layer")
    if norm_layer not in (None, "layernorm", "rmsnorm"):
        raise _refuse(where, architecture, f"norm_layer={norm_layer!r}")
    rms = norm_layer == "rmsnorm" or (norm_layer is None and architecture.startswith("aimv2_"))
    if not rms and "blocks.0.norm1.bias" not in tensors:
        raise _refuse(where, architecture, "norms without a bias (an RMSNorm-style norm_layer its config does not "
                                           "name)")
    return "rms_norm" if rms else "layer_norm"


def _pooling(tensors, timm_config, model_args, architecture, where) -> str:
    """timm's global_pool as a keras-vit classifier ("token", "gap" or "map")."""
    has_cls, attn_pool = "cls_token" in tensors, "attn_pool.latent" in tensors
    registers = "reg_token" in tensors
    # "" (no pooling: a feature extractor) reads like the model's own pooling: DINOv3's builders
    # average the patch tokens (their class token attends but is not read).
    pool = timm_config.get("global_pool") or model_args.get("global_pool") or (
        "map" if attn_pool else "token" if has_cls and not _DINOV3.match(architecture or "") else "avg")
    include_prefix = bool(model_args.get("pool_include_prefix", False))
    if pool not in ("token", "avg", "map"):
        raise _refuse(where, architecture, f"global_pool={pool!r} (keras-vit pools by the class token, the mean of "
                                           f"the patch tokens or a MAP head)")
    if (pool == "map") != attn_pool:
        raise _refuse(where, architecture, f"global_pool={pool!r} {'with' if attn_pool else 'without'} an "
                                           f"attention pool (attn_pool.*)")
    if pool == "map":
        if any(k.startswith("attn_pool.") and k.endswith(".weight") and k[len("attn_pool."):].split(".")[0]
               not in ("q", "kv", "proj", "norm", "mlp") for k in tensors):
            raise _refuse(where, architecture, "an attention pool with parts other than latent, q, kv, proj, norm, "
                                               "mlp")
        if "attn_pool.proj.weight" not in tensors or "attn_pool.mlp.fc1.weight" not in tensors:
            raise _refuse(where, architecture, "an attention pool without its projection and MLP (out_features=0)")
        latent = tensors["attn_pool.latent"]
        width = int(tensors["patch_embed.proj.weight"].shape[0])
        if tuple(latent.shape) != (1, 1, width):
            raise _refuse(where, architecture, f"an attention-pool latent of shape {tuple(latent.shape)} (keras-vit's "
                                               f"MAP head has one probe as wide as the tokens)")
        if (has_cls or registers) and not include_prefix:
            raise _refuse(where, architecture, "a MAP head over the patch tokens only, after prefix tokens "
                                               "(keras-vit's MAP head attends over every token)")
        return "map"
    if pool == "token":
        if not has_cls:
            raise _refuse(where, architecture, "global_pool='token' without a class token")
        return "token"
    if "dist_token" in tensors:
        raise _refuse(where, architecture, "global_pool='avg' with a distillation token (keras-vit's DeiT reads its "
                                           "two tokens)")
    if (registers or has_cls) and include_prefix:
        raise _refuse(where, architecture, "average pooling over its prefix tokens too (pool_include_prefix=True)")
    return "gap"  # the mean of the patch tokens; a class token, if any, only attends


def _tokens(tensors: Dict[str, np.ndarray], image_size: Optional[Tuple[int, int]], patch: int, where: str):
    """Puts timm's prefix tokens and position table into ours: the table with a row for each
    class / distillation token (a zero row where timm gives none, no_embed_class=True) and
    none for registers (a row timm has for one is added to it: timm adds it unchanged).
    Returns (tensors, grid tokens, no_embed_class)."""
    tensors = dict(tensors)
    posemb = np.asarray(tensors["pos_embed"], np.float32)
    width = posemb.shape[-1]
    positioned = int("cls_token" in tensors) + int("dist_token" in tensors)
    registers = int(tensors["reg_token"].shape[1]) if "reg_token" in tensors else 0
    prefix = positioned + registers
    rows = int(posemb.shape[1])
    if image_size is not None:
        grid = (image_size[0] // patch) * (image_size[1] // patch)
        if rows == grid + prefix:
            embed_class = True
        elif rows == grid:
            embed_class = False
        else:
            raise UserError(f"{where}: pos_embed has {rows} rows, which is neither the {grid} patches of its "
                            f"config's {image_size} input nor those and its {prefix} prefix tokens.")
    else:
        with_prefix, alone = rows - prefix, rows

        def square(n):
            return n > 0 and int(round(n ** 0.5)) ** 2 == n

        if prefix and square(with_prefix) and square(alone):
            raise UserError(f"{where}: cannot tell whether pos_embed's {rows} rows include its {prefix} prefix "
                            f"tokens; put timm's config.json (with pretrained_cfg.input_size) next to it.")
        embed_class = not prefix or square(with_prefix)
        grid = rows - prefix if embed_class else rows
    if embed_class:
        if registers:
            tensors["reg_token"] = tensors["reg_token"] + posemb[:, positioned:prefix]
        posemb = np.concatenate([posemb[:, :positioned], posemb[:, prefix:]], axis=1)
    elif positioned:
        posemb = np.concatenate([np.zeros((1, positioned, width), np.float32), posemb], axis=1)
    tensors["pos_embed"] = posemb
    return tensors, grid, prefix > 0 and not embed_class


def _pixel_normalization(pretrained: dict) -> Optional[str]:
    """The keras-vit name of pretrained_cfg's mean/std (timm.data's constants), or None."""
    from keras_vit.images import NORMALIZATIONS

    mean, std = pretrained.get("mean"), pretrained.get("std")
    if mean is None or std is None:
        return None
    for name, (m, s) in NORMALIZATIONS.items():
        if np.allclose(mean, np.asarray(m) / 255, rtol=0, atol=1e-6) and np.allclose(std, np.asarray(s) / 255,
                                                                                      rtol=0, atol=1e-6):
            return name
    return None


def read_timm(weights_path, config_path=None, source=None) -> Checkpoint:
    """A timm ViT model.safetensors (+ its config.json) as a Checkpoint."""
    weights_path = os.fspath(weights_path)
    where = source or weights_path
    if not os.path.isfile(weights_path):
        raise UserError(f"{where}: no timm weights file {weights_path!r} (timm repos hold model.safetensors; "
                        f"keras-vit never reads pytorch_model.bin pickles).")
    timm_config = read_json(config_path) if config_path else {}
    architecture = timm_config.get("architecture")
    if architecture:
        architecture = str(architecture).split(".")[0]  # a "NAME.TAG" reads as NAME
    model_args = timm_config.get("model_args") or {}
    rope = bool(_DINOV3.match(architecture or ""))
    tensors = read_safetensors(weights_path)
    if rope:
        tensors = _eva_tensors(tensors)
    elif _OTHER_ROPE.search(architecture or "") or any(_EVA_KEY.search(key) for key in tensors):
        # timm's Eva class also builds EVA-01/02, naver's RoPE-ViT and PE, whose rotary positions live
        # in buffers no file holds: only DINOv3's builders are known to compute as keras-vit does.
        raise _refuse(where, architecture, "the layout of timm's Eva models other than DINOv3 (EVA, RoPE-ViT, "
                                           "Perception Encoder: rotary positions or norms of their own; a DINOv3 is "
                                           "known by the architecture of timm's config.json: put it next to "
                                           "model.safetensors)")
    _check_layout(tensors, architecture, rope, where)

    has_dist = "dist_token" in tensors
    has_head = "head.weight" in tensors
    classifier = _pooling(tensors, timm_config, model_args, architecture, where)
    has_norm, has_fc_norm = "norm.weight" in tensors, "fc_norm.weight" in tensors
    if has_norm and has_fc_norm:
        raise _refuse(where, architecture, "both a final norm and fc_norm")
    if not has_norm and not has_fc_norm:
        raise _refuse(where, architecture, "no final LayerNorm (final_norm=False)")
    if has_fc_norm and (classifier == "map" or has_dist):
        raise _refuse(where, architecture, "fc_norm after " + ("the MAP head" if classifier == "map" else
                                                               "two tokens' heads"))
    if has_dist and (not has_head or "head_dist.weight" not in tensors):
        raise _refuse(where, architecture, "a distillation token without its two heads (timm's features are then "
                                           "the mean of the class and distillation tokens)")
    pre_norm = "norm_pre.weight" in tensors
    attn_pool = classifier == "map"
    if (pre_norm or attn_pool) and not architecture:
        raise UserError(f"{where}: a timm {'CLIP' if pre_norm else 'SigLIP'}-style ViT computes with the activation "
                        f"(and LayerNorm eps) of its architecture, which only timm's config.json names; put it "
                        f"(with 'architecture') next to model.safetensors.")
    architecture_name = architecture or ""
    mlp_activation, gelu_approximate = _activation(architecture_name, model_args, where)
    norm = _norm_kind(tensors, architecture_name, model_args, where)
    projection_biases = _projection_biases(tensors, architecture, where)

    proj = tensors["patch_embed.proj.weight"]  # (D, C, p, p)
    width, channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[2])
    if proj.shape[2] != proj.shape[3]:
        raise UserError(f"{where} has non-square patches ({proj.shape[2]}x{proj.shape[3]}); keras-vit's patches "
                        f"are square.")
    depth = len({int(m.group(1)) for k in tensors for m in [re.match(r"blocks\.(\d+)\.", k)] if m})
    if "blocks.0.mlp.fc1_g.weight" in tensors:  # timm's SwiGLU: gate and value in two tensors
        if (model_args.get("act_layer") not in ("silu", "swish") and not architecture_name.startswith("aimv2_")
                and not rope):  # AIMv2's and DINOv3's SwiGLU is SiLU-gated
            raise _refuse(where, architecture, "a gated MLP (fc1_g / fc1_x) whose activation is not SiLU")
        mlp, mlp_activation = int(tensors["blocks.0.mlp.fc1_g.weight"].shape[0]), "swiglu"
    else:
        fc1, fc2 = tensors["blocks.0.mlp.fc1.weight"], tensors["blocks.0.mlp.fc2.weight"]
        mlp = int(fc1.shape[0])
        if int(fc2.shape[1]) * 2 == mlp:
            if architecture_name not in _SWIGLU_PACKED:
                raise _refuse(where, architecture, "a packed gated MLP (fc1 twice fc2's width) whose activation and "
                                                   "gate order only timm's SwiGLUPacked builders (DINOv2 giant) fix")
            mlp, mlp_activation = mlp // 2, "swiglu"

    pretrained = timm_config.get("pretrained_cfg", {})
    image_size = None
    if "input_size" in pretrained:
        image_size = (int(pretrained["input_size"][1]), int(pretrained["input_size"][2]))
    if rope:  # no table: any size; the model is built at the pretrained size (DINOv3's 256)
        grid_tokens, no_embed_class = None, False
        image_size = image_size or (224, 224)
    else:
        tensors, grid_tokens, no_embed_class = _tokens(tensors, image_size, patch, where)
    if image_size is not None:
        cropped = (image_size[0] // patch * patch, image_size[1] // patch * patch)
        if cropped != image_size:
            _console.warn(f"{where} takes {image_size} images whose last rows/columns timm's patch embedding "
                          f"never reads (patches of {patch}); keras-vit's model is {cropped}: crop images to that "
                          f"(top left) for timm's outputs.")
            image_size = cropped
    else:
        side = grid_side(grid_tokens, where) * patch
        image_size = (side, side)

    projection = None
    if (pre_norm and has_head and not timm_config.get("label_names") and "head.bias" in tensors
            and not np.any(tensors["head.bias"])):
        # CLIP's visual projection, which timm holds as a head with a zero bias.
        tensors["projection.weight"] = tensors.pop("head.weight")
        tensors.pop("head.bias")
        projection = int(tensors["projection.weight"].shape[0])
    layer_scale = "blocks.0.ls1.gamma" in tensors
    family = (has_dist or "reg_token" in tensors or layer_scale or pre_norm or attn_pool or has_fc_norm
              or no_embed_class or mlp_activation == "swiglu" or bool(_FAMILY_NAME.search(architecture_name)))
    fields = dict(
        patch_size=patch, hidden_size=width, mlp_dim=mlp,
        num_heads=_num_heads(architecture, model_args, width, depth, mlp, where), num_layers=depth,
        classifier=classifier,
        representation_size=(int(tensors["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in tensors
                             else None),
        # Every *_clip_*, DINOv3 and AIMv2 builder: norm_layer=partial(LayerNorm or RmsNorm, eps=1e-5);
        # timm's LayerNorm and RmsNorm default to 1e-6.
        layer_norm_epsilon=1e-5 if "_clip_" in architecture_name or rope or architecture_name.startswith("aimv2_")
        else 1e-6,
        gelu_approximate=gelu_approximate, mlp_activation=mlp_activation,
        num_register_tokens=int(tensors["reg_token"].shape[1]) if "reg_token" in tensors else 0,
        distillation_token=has_dist, distillation_head=has_dist,
        # The gammas are loaded; the value is timm's init_values (DeiT III 1e-6, DINOv2 1e-5).
        layer_scale_init=(1e-6 if architecture_name.startswith("deit3") else 1e-5) if layer_scale else None,
        pre_norm=pre_norm, patch_bias="patch_embed.proj.bias" in tensors,
        final_norm="pooled" if has_fc_norm else "tokens", projection_size=projection,
        class_token=True if "cls_token" in tensors and classifier not in ("token",) else None,
        norm=norm, patch_norm="patch_embed.norm.weight" in tensors, projection_biases=projection_biases,
    )
    if rope:
        fields.update(position_embedding="rope", rope_theta=float(model_args.get("rope_temperature", 100.0)))
    normalization = _pixel_normalization(pretrained)
    mean, std = pretrained.get("mean"), pretrained.get("std")
    if family:
        # timm's resample_abs_pos_embed: F.interpolate(bicubic, antialias=True) of the grid rows.
        fields["position_interpolation"] = "bicubic_antialias"
        if normalization is not None:
            fields["pixel_normalization"] = normalization
        elif mean is None:
            _console.warn(f"{where} has no pretrained_cfg mean/std (timm's config.json): keras-vit assumes "
                          f"[-1, 1] pixels; normalise images as the weights expect yourself.")
        else:
            _console.warn(f"{where} expects inputs normalised with mean {mean} and std {std} (pretrained_cfg), "
                          f"which is none of keras-vit's pixel normalisations: normalise images that way yourself.")
    elif mean is not None and normalization != "minus_one_to_one":
        _console.warn(f"{where} expects inputs normalised with mean {mean} and std {std}, not the [-1, 1] "
                      f"scaling of keras_vit.preprocess_input: normalise images that way yourself.")
    config = ViTConfig(**fields)
    labels = timm_config.get("label_names")
    params = params_from_timm(tensors, config)
    head = params.get("head/kernel")
    if labels is not None and (head is None or len(labels) != head.shape[-1]):
        labels = None
    return Checkpoint(config=config, params=params, image_size=image_size, labels=labels, source=where,
                      num_channels=channels)
