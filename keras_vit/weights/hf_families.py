"""HF transformers checkpoints of ViT and its relatives: ViT itself, DeiT,
DINOv2 (with and without registers), DINOv3 (rotary positions), and the vision
towers of SigLIP, SigLIP2 (NaFlex), AIMv2, CLIP and MetaCLIP 2 (CLIP's architecture and file layout under
its own model_type).

Each is the ViT encoder with a few knobs turned (ViTConfig's
distillation_token, num_register_tokens, layer_scale_init, mlp_activation,
pre_norm, final_norm, classifier="map", ...). An adapter here reads the
family's config.json into those knobs and names its tensors for the parts of
the one key table (keras_vit.weights.layout, through the block rules of
keras_vit.weights.checkpoint); the strict loader then checks every key and
shape. ViT's names, read backwards, are what the HF writer writes
(keras_vit.weights.hf). A tensor no rule uses keeps its own name, so the loader
reports it; the few that are deliberately left out are dropped by name below,
each with its reason.

The names are the ones on disk, which `save_pretrained` still writes in
transformers 5 (its in-memory modules are renamed only when loading):
"encoder.layer.N.attention.attention.query.weight" (DeiT, DINOv2),
"encoder.layers.N.self_attn.q_proj.weight" (CLIP, SigLIP). Towers saved on
their own by transformers 4 carry a "vision_model." prefix that 5 leaves out;
both are read.

Defaults of absent config.json fields are transformers' own (its Config
classes), copied here as constants: keras_vit never imports transformers.
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from keras_vit.errors import UserError
from keras_vit.weights.checkpoint import (
    ACTIVATIONS,
    CONV,
    LINEAR,
    POSEMB_KEY,
    activation,
    no_qkv_bias,
    patch_linear_kernels,
    qkv_biases,
    qkv_kernels,
    rename,
    torch_block,
    torch_dense,
    torch_map_head,
    torch_norm,
)
from keras_vit.weights.hf_modules import AIMV2, DINOV3, DINOV3_GATED, TOWER, VIT, blocks_of
from keras_vit.weights.layout import ENCODER_NORM, PATCH_NORM, attention_pool_key

# transformers' Config defaults (transformers 5), for fields a config.json leaves out. ViT's
# sizes have none here: transformers writes them all, so a missing one is a damaged file.
_VIT_DEFAULTS = dict(hidden_act="gelu", layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
                     qkv_bias=True, pooler_output_size=None, pooler_act="tanh")
_VIT_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_DEIT_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      hidden_act="gelu", layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
                      qkv_bias=True, pooler_output_size=None, pooler_act="tanh")
_DINOV2_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4,
                        hidden_act="gelu", layer_norm_eps=1e-6, image_size=224, patch_size=14, num_channels=3,
                        qkv_bias=True, layerscale_value=1.0, use_swiglu_ffn=False)
# Dinov2WithRegistersConfig differs from Dinov2Config in its patch size and has registers.
_DINOV2_REGISTERS_DEFAULTS = dict(_DINOV2_DEFAULTS, patch_size=16, num_register_tokens=4)
_SIGLIP_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, image_size=224, patch_size=16,
                        num_channels=3, vision_use_head=True)
# Siglip2VisionConfig: SigLIP's, with a learned table of num_patches (a square grid) that
# each image's own grid resizes (NaFlex), and no image_size.
_SIGLIP2_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                         hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, patch_size=16, num_channels=3,
                         vision_use_head=True, num_patches=256)
_CLIP_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      hidden_act="quick_gelu", layer_norm_eps=1e-5, image_size=224, patch_size=32, num_channels=3,
                      projection_dim=512)

# Torch buffers some older files hold (CLIP's and SigLIP's embeddings.position_ids,
# an arange of the positions): not weights, nothing to load.
_BUFFERS = ("position_ids",)


class Mapped(NamedTuple):
    """A family checkpoint read into keras_vit's terms, before the ViTConfig is built.

    fields: ViTConfig keyword arguments; params: {official key: array}
    (unknown tensors under their own names); image_size: (height, width) the
    position embedding was trained for; labels: the head's class names or None.
    """

    fields: Dict[str, object]
    params: Dict[str, np.ndarray]
    image_size: Tuple[int, int]
    labels: Optional[List[str]]
    num_channels: int
    # True where the family takes every image at its own grid (SigLIP2's NaFlex): from_pretrained
    # then builds a model for any size unless asked otherwise.
    dynamic_image_size: bool = False


# --- shared pieces ---

def _settings(hf: dict, defaults: dict) -> dict:
    """The config with transformers' defaults filled in (a null counts as absent)."""
    out = dict(defaults)
    out.update({k: v for k, v in hf.items() if v is not None})
    return out


def _side(value, what: str, where: str) -> Tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise UserError(f"{where}: {what}={value!r} is not an int or a (height, width) pair.")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _patch_size(c: dict, where: str) -> int:
    height, width = _side(c["patch_size"], "patch_size", where)
    if height != width:
        raise UserError(f"{where} has non-square patches ({height}x{width}); keras-vit's patches are square.")
    return height


def _activation(c: dict, where: str) -> Tuple[str, bool]:
    return activation(c["hidden_act"], "hidden_act", where)


def _check_attention(c: dict, where: str) -> Tuple[int, int]:
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    if hidden % heads:
        raise UserError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}.")
    head_dim = c.get("head_dim")
    if head_dim is not None and int(head_dim) * heads != hidden:
        raise UserError(f"{where} has head_dim={head_dim} with {heads} heads of a {hidden}-wide model; keras-vit's "
                        f"heads split the width evenly (head_dim = hidden_size / heads).")
    if not c.get("qkv_bias", True):
        raise no_qkv_bias(where)
    return hidden, heads


def _drop(tensors: Dict[str, np.ndarray], unwanted: Callable[[str], bool]) -> Dict[str, np.ndarray]:
    return {k: v for k, v in tensors.items() if not unwanted(k)}


def _is_buffer(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in _BUFFERS


def _vision_prefix(tensors: Dict[str, np.ndarray]) -> str:
    """"vision_model." where a tower's names carry it (a full model, transformers 4's tower), else ""."""
    return "vision_model." if any(k.startswith("vision_model.embeddings.") for k in tensors) else ""


def _grid_image_size(configured: Tuple[int, int], posemb: Optional[np.ndarray], positioned: int, patch: int,
                     where: str) -> Tuple[int, int]:
    """The image size of the position table: config.json's, unless the table holds another
    (square) grid, as in configs that leave image_size at a default the weights do not have."""
    if posemb is None:
        return configured
    tokens = int(posemb.shape[-2]) - positioned
    if (configured[0] // patch) * (configured[1] // patch) == tokens:
        return configured
    side = int(round(tokens ** 0.5))
    if side * side != tokens:
        raise UserError(f"{where}: the position embedding holds {tokens} patch positions, which is neither the "
                        f"{configured} image_size of its config.json nor a square grid.")
    return side * patch, side * patch


def hf_labels(hf: dict, num_classes: Optional[int]) -> Optional[List[str]]:
    """The class names of config.json's id2label for a head of `num_classes` (ViT's too)."""
    id2label = hf.get("id2label")
    if not id2label or num_classes is None or len(id2label) != num_classes:
        return None
    names = [id2label.get(str(i), id2label.get(i)) for i in range(num_classes)]
    if any(name is None for name in names) or all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return None  # transformers' placeholders carry no information
    return names


def _labels(hf: dict, params: Dict[str, np.ndarray]) -> Optional[List[str]]:
    head = params.get("head/kernel")
    return hf_labels(hf, None if head is None else int(head.shape[-1]))


def _require(tensors: Dict[str, np.ndarray], name: str, what: str, where: str, family: str) -> None:
    if name not in tensors:
        raise UserError(f"{where}: model.safetensors has no {name} ({what}); is it an HF {family} checkpoint?")


# --- ViT and DeiT: one layout ---

def vit_table(prefix: str, num_layers: int, heads: int, heads_named=(("head", "classifier"),)) -> dict:
    """HF ViT's (and DeiT's) names for the official keys: the reader's rules, and read
    backwards (checkpoint.unrename), what the HF writer writes. `prefix` is "vit." or
    "deit." for a model with a head, "" for a bare ViTModel; `heads_named` pairs our
    classifier keys with the source's."""
    e = prefix + "embeddings."
    table = {"cls": (e + "cls_token", None), POSEMB_KEY: (e + "position_embeddings", None)}
    torch_dense(table, "embedding", e + "patch_embeddings.projection", kernel=CONV)
    for i in range(num_layers):
        torch_block(table, i, prefix + VIT.on_disk.format(i=i), VIT.parts, heads)
    torch_norm(table, ENCODER_NORM, prefix + "layernorm")
    torch_dense(table, "pre_logits", prefix + "pooler.dense")
    for ours, theirs in heads_named:
        torch_dense(table, ours, theirs)
    return table


def _pooler(c: dict, tensors: Dict[str, np.ndarray], prefix: str, where: str, classifies: bool) -> bool:
    """Whether the pooler is the model's representation layer: a bare model's. The image
    classifiers have none (add_pooling_layer=False); a bare base's pooler under a new
    classifier (a peft adapter's modules_to_save, a run's new head) is left out, as
    transformers leaves it when it loads such a base into its classifier."""
    if classifies:
        return False
    has_pooler = prefix + "pooler.dense.weight" in tensors
    if has_pooler and c["pooler_act"] != "tanh":
        raise UserError(f"{where} has pooler_act={c['pooler_act']!r}; keras-vit's representation layer is tanh.")
    return has_pooler


def vit(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """ViTModel (with or without its pooler) and ViTForImageClassification. HF's ViT computes
    what the official one does with its own numerics: hidden_act="gelu" is the exact GELU,
    layer_norm_eps 1e-12 by default; both travel in ViTConfig. The pixel normalisation is the
    directory's preprocessor's (weights.hf)."""
    missing = [k for k in _VIT_SIZES if k not in hf]
    if missing:
        raise UserError(f"{where}: config.json has no {', '.join(missing)} (transformers writes every size): "
                        f"the file is damaged; restore it from the original checkpoint.")
    c = _settings(hf, _VIT_DEFAULTS)
    hidden, heads = _check_attention(c, where)
    mlp_activation, gelu_approximate = _activation(c, where)
    prefix = "vit." if any(k.startswith("vit.") for k in tensors) else ""
    _require(tensors, prefix + "embeddings.cls_token", "the class token", where, "ViT")
    has_pooler = _pooler(c, tensors, prefix, where, new_head or "classifier.weight" in tensors)
    layers = int(c["num_hidden_layers"])
    # A ViTModel's mask_token (use_mask_token=True) is reported by the loader; its pooler under a
    # classifier is dropped (_pooler).
    pooler = prefix + "pooler."
    params = rename(_drop(tensors, lambda k: not has_pooler and k.startswith(pooler)),
                    vit_table(prefix, layers, heads))
    patch = _patch_size(c, where)
    image_size = _grid_image_size(_side(c["image_size"], "image_size", where), params.get(POSEMB_KEY), 1, patch,
                                  where)
    fields = dict(
        patch_size=patch, hidden_size=hidden, mlp_dim=int(c["intermediate_size"]), num_heads=heads,
        num_layers=layers, classifier="token",
        representation_size=int(c["pooler_output_size"] or hidden) if has_pooler else None,
        layer_norm_epsilon=float(c["layer_norm_eps"]), gelu_approximate=gelu_approximate,
        mlp_activation=mlp_activation,
    )
    return Mapped(fields, params, image_size, _labels(hf, params), int(c["num_channels"]))


def deit(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """DeiTModel (with or without its pooler), DeiTForImageClassification (one head on the
    class token) and DeiTForImageClassificationWithTeacher (a second head on the
    distillation token; transformers' logits are the mean of the two)."""
    c = _settings(hf, _DEIT_DEFAULTS)
    hidden, heads = _check_attention(c, where)
    mlp_activation, gelu_approximate = _activation(c, where)
    prefix = "deit." if any(k.startswith("deit.embeddings.") for k in tensors) else ""
    if any(k.startswith("decoder.") for k in tensors):
        raise UserError(f"{where} is a DeiTForMaskedImageModeling checkpoint (a pixel decoder on the tokens); "
                        f"keras-vit reads DeiTModel and the DeiT image classifiers.")
    _require(tensors, prefix + "embeddings.distillation_token", "the DeiT distillation token", where, "DeiT")
    with_teacher = "distillation_classifier.weight" in tensors
    has_pooler = _pooler(c, tensors, prefix, where,
                         new_head or with_teacher or "classifier.weight" in tensors)
    e = prefix + "embeddings."
    heads_named = ((("head", "cls_classifier"), ("head_dist", "distillation_classifier")) if with_teacher
                   else (("head", "classifier"),))
    table = {"dist_token": (e + "distillation_token", None),
             **vit_table(prefix, int(c["num_hidden_layers"]), heads, heads_named)}
    # mask_token exists only in DeiTForMaskedImageModeling (refused above) and in a DeiTModel
    # built with use_mask_token=True: it replaces masked patches in pre-training only.
    pooler = prefix + "pooler."
    params = rename(_drop(tensors, lambda k: _is_buffer(k) or k == e + "mask_token" or (
        not has_pooler and k.startswith(pooler))), table)
    patch = _patch_size(c, where)
    image_size = _grid_image_size(_side(c["image_size"], "image_size", where), params.get(POSEMB_KEY), 2, patch,
                                  where)
    fields = dict(
        patch_size=patch, hidden_size=hidden, mlp_dim=int(c["intermediate_size"]), num_heads=heads,
        num_layers=int(c["num_hidden_layers"]), classifier="token",
        representation_size=int(c["pooler_output_size"] or hidden) if has_pooler else None,
        layer_norm_epsilon=float(c["layer_norm_eps"]), gelu_approximate=gelu_approximate,
        mlp_activation=mlp_activation, distillation_token=True, distillation_head=with_teacher,
        position_interpolation="bicubic", pixel_normalization="imagenet",
    )
    return Mapped(fields, params, image_size, _labels(hf, params), int(c["num_channels"]))


# --- DINOv2, with and without registers ---

def _swiglu_width(hidden: int, mlp_ratio: float) -> int:
    """Dinov2SwiGLUFFN's hidden width: 2/3 of the MLP's, rounded up to a multiple of 8."""
    width = int(hidden * mlp_ratio)
    return (int(width * 2 / 3) + 7) // 8 * 8


def _dinov2(hf: dict, tensors: Dict[str, np.ndarray], where: str, registers: bool, new_head: bool) -> Mapped:
    family = "DINOv2 with registers" if registers else "DINOv2"
    c = _settings(hf, _DINOV2_REGISTERS_DEFAULTS if registers else _DINOV2_DEFAULTS)
    hidden, heads = _check_attention(c, where)
    swiglu = bool(c["use_swiglu_ffn"])
    if swiglu:
        # Dinov2SwiGLUFFN is silu(x W_gate) * (x W_up) whatever hidden_act says.
        mlp_activation, gelu_approximate = "swiglu", ACTIVATIONS.get(c["hidden_act"], ("gelu", False))[1]
        mlp_dim = _swiglu_width(hidden, float(c["mlp_ratio"]))
    else:
        mlp_activation, gelu_approximate = _activation(c, where)
        mlp_dim = int(hidden * float(c["mlp_ratio"]))
    model_prefix = "dinov2_with_registers." if registers else "dinov2."
    prefix = model_prefix if any(k.startswith(model_prefix + "embeddings.") for k in tensors) else ""
    e = prefix + "embeddings."
    _require(tensors, e + "cls_token", "the class token", where, family)
    num_registers = 0
    if registers:
        _require(tensors, e + "register_tokens", "the register tokens", where, family)
        num_registers = int(tensors[e + "register_tokens"].shape[-2])
    table = {
        "cls": (e + "cls_token", None),
        POSEMB_KEY: (e + "position_embeddings", None),
        "embedding/kernel": (e + "patch_embeddings.projection.weight", CONV),
        "embedding/bias": (e + "patch_embeddings.projection.bias", None),
    }
    if registers:
        table["reg_tokens"] = (e + "register_tokens", None)
    torch_norm(table, ENCODER_NORM, prefix + "layernorm")
    torch_dense(table, "head", "classifier")
    blocks = blocks_of(hf)  # DINOV2, or DINOV2_SWIGLU: its MLP's names
    for i in range(int(c["num_hidden_layers"])):
        torch_block(table, i, prefix + blocks.on_disk.format(i=i), blocks.parts, heads)
    # embeddings.mask_token replaces masked patches in DINOv2's (iBOT) masked pre-training and
    # nowhere else (bool_masked_pos); inference never reads it.
    params = rename(_drop(tensors, lambda k: _is_buffer(k) or k == e + "mask_token"), table)
    has_head = new_head or "head/kernel" in params
    patch = _patch_size(c, where)
    image_size = _grid_image_size(_side(c["image_size"], "image_size", where), params.get(POSEMB_KEY), 1, patch,
                                  where)
    fields = dict(
        patch_size=patch, hidden_size=hidden, mlp_dim=mlp_dim, num_heads=heads,
        num_layers=int(c["num_hidden_layers"]),
        # Dinov2(WithRegisters)ForImageClassification's classifier reads the class token next to
        # the mean of the patch tokens (registers left out); the bare model's pooler_output is
        # the class token.
        classifier="token_gap" if has_head else "token",
        layer_norm_epsilon=float(c["layer_norm_eps"]), gelu_approximate=gelu_approximate,
        mlp_activation=mlp_activation, num_register_tokens=num_registers,
        layer_scale_init=float(c["layerscale_value"]),
        position_interpolation="bicubic_antialias" if registers else "bicubic", pixel_normalization="imagenet",
    )
    return Mapped(fields, params, image_size, _labels(hf, params), int(c["num_channels"]))


def dinov2(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """Dinov2Model (or Dinov2Backbone) and Dinov2ForImageClassification; MLP or SwiGLU."""
    return _dinov2(hf, tensors, where, registers=False, new_head=new_head)


def dinov2_with_registers(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """Dinov2WithRegistersModel and Dinov2WithRegistersForImageClassification."""
    return _dinov2(hf, tensors, where, registers=True, new_head=new_head)


# --- DINOv3: registers, LayerScale, rotary positions instead of a table ---

# DINOv3ViTConfig's defaults (transformers 5.24).
_DINOV3_DEFAULTS = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                        hidden_act="gelu", layer_norm_eps=1e-5, image_size=224, patch_size=16, num_channels=3,
                        rope_theta=100.0, query_bias=True, key_bias=False, value_bias=True, proj_bias=True,
                        mlp_bias=True, layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0,
                        pos_embed_shift=None, pos_embed_jitter=None, pos_embed_rescale=2.0)


def _dinov3_tensors(tensors: Dict[str, np.ndarray], blocks: str, layers: int, hidden: int,
                    gated: bool) -> Dict[str, np.ndarray]:
    """DINOv3's tensors in the shapes the block rules read.

    A missing key bias (key_bias=False, every published DINOv3) is a zero bias, which computes
    the same: it adds q.b to every logit of a query alike, and the softmax ignores that (its
    gradient is zero too, so fine-tuning leaves it at zero). The gated MLP's gate_proj and
    up_proj are one Dense of twice the width, the gate first (mlp_activation="swiglu")."""
    tensors = dict(tensors)
    for i in range(layers):
        block = blocks.format(i=i)
        tensors.setdefault(block + "attention.k_proj.bias", np.zeros((hidden,), np.float32))
        if gated:
            for leaf in ("weight", "bias"):
                gate, up = (f"{block}{module}.{leaf}" for module in DINOV3_GATED.modules["fc1"])
                if gate in tensors and up in tensors:  # else both keep their names, for the loader to report
                    tensors[up] = np.concatenate([tensors.pop(gate), tensors[up]], axis=0)
    return tensors


def dinov3_vit(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """DINOv3ViTModel (and DINOv3ViTBackbone's weights): features = pooler_output, the class
    token after the final LayerNorm; plain or gated MLP, with or without registers. transformers
    has no DINOv3 image classifier: a new head reads these features (new_head changes nothing)."""
    c = _settings(hf, _DINOV3_DEFAULTS)
    hidden, heads = _check_attention(c, where)
    for flag in ("query_bias", "value_bias", "proj_bias", "mlp_bias"):
        if not c[flag]:
            raise UserError(f"{where} has {flag}=False; keras-vit's DINOv3 blocks have these biases (a checkpoint "
                            f"without them would need them fixed at zero, which keras-vit does not do).")
    gated = bool(c["use_gated_mlp"])
    if gated:
        # DINOv3ViTGatedMLP is act(x W_gate) * (x W_up): SwiGLU when the activation is silu.
        if c["hidden_act"] not in ("silu", "swish"):
            raise UserError(f"{where} has a gated MLP with hidden_act={c['hidden_act']!r}; keras-vit's gated MLP "
                            f"is SwiGLU (hidden_act='silu').")
        mlp_activation, gelu_approximate = "swiglu", False
    else:
        mlp_activation, gelu_approximate = _activation(c, where)
    e = "embeddings."
    _require(tensors, e + "cls_token", "the class token", where, "DINOv3")
    layers = int(c["num_hidden_layers"])
    # On disk the blocks are "layer.N." (transformers 4.56, which published DINOv3, and what
    # transformers 5 still writes); its in-memory modules say "model.layer.N.".
    blocks = DINOV3.in_memory if any(k.startswith(DINOV3.in_memory.format(i=0)) for k in tensors) else DINOV3.on_disk
    tensors = _dinov3_tensors(tensors, blocks, layers, hidden, gated)
    table = {
        "cls": (e + "cls_token", None),
        "embedding/kernel": (e + "patch_embeddings.weight", CONV),
        "embedding/bias": (e + "patch_embeddings.bias", None),
        "reg_tokens": (e + "register_tokens", None),
    }
    torch_norm(table, ENCODER_NORM, "norm")
    for i in range(layers):
        torch_block(table, i, blocks.format(i=i), DINOV3.parts, heads)
    registers = e + "register_tokens"
    num_registers = int(tensors[registers].shape[-2]) if registers in tensors else 0
    # embeddings.mask_token is for masked pre-training only (bool_masked_pos), as DINOv2's; a
    # DINOv3ViTModel folder with no registers still saves an empty (1, 0, D) register_tokens.
    unused = {e + "mask_token"} | ({registers} if not num_registers else set())
    params = rename(_drop(tensors, lambda k: _is_buffer(k) or k in unused), table)
    fields = dict(
        patch_size=_patch_size(c, where), hidden_size=hidden, mlp_dim=int(c["intermediate_size"]), num_heads=heads,
        num_layers=layers, classifier="token", layer_norm_epsilon=float(c["layer_norm_eps"]),
        gelu_approximate=gelu_approximate, mlp_activation=mlp_activation, num_register_tokens=num_registers,
        layer_scale_init=float(c["layerscale_value"]), position_embedding="rope",
        rope_theta=float(c["rope_theta"]), pixel_normalization="imagenet",
        # The coordinates' augmentation in training (fine-tuning), as transformers applies it in train mode.
        # An explicit null turns one off (transformers' None): read from the file itself, not _settings,
        # which fills a null with the default.
        **{field: hf.get(key, _DINOV3_DEFAULTS[key]) for field, key in (
            ("rope_shift", "pos_embed_shift"), ("rope_jitter", "pos_embed_jitter"), ("rope_rescale", "pos_embed_rescale"))},
    )
    return Mapped(fields, params, _side(c["image_size"], "image_size", where), None, int(c["num_channels"]))


# --- CLIP and SigLIP vision towers ---

def _vision_config(hf: dict) -> dict:
    """A full model's vision_config (transformers 4's vision_config_dict overriding it, as
    CLIPConfig does; absent fields, or an absent vision_config, are the tower's defaults)."""
    vision = dict(hf.get("vision_config") or {})
    vision.update(hf.get("vision_config_dict") or {})
    return vision


def _tower_fields(c: dict, where: str, family: str) -> dict:
    hidden, heads = _check_attention(c, where)
    mlp_activation, gelu_approximate = _activation(c, where)
    return dict(patch_size=_patch_size(c, where), hidden_size=hidden, mlp_dim=int(c["intermediate_size"]),
                num_heads=heads, num_layers=int(c["num_hidden_layers"]),
                layer_norm_epsilon=float(c["layer_norm_eps"]), gelu_approximate=gelu_approximate,
                mlp_activation=mlp_activation, position_interpolation="bicubic")


# SiglipMultiheadAttentionPoolingHead's names for the MAP head's parts (query, key and value
# as _split_in_proj leaves them).
_SIGLIP_MAP_HEAD = dict(probe="probe", query="attention.in_proj.query", key="attention.in_proj.key",
                        value="attention.in_proj.value", out="attention.out_proj", norm="layernorm",
                        fc1="mlp.fc1", fc2="mlp.fc2")


def _split_in_proj(tensors: Dict[str, np.ndarray], attention: str) -> Dict[str, np.ndarray]:
    """torch.nn.MultiheadAttention packs query, key and value as the thirds of in_proj_weight
    and in_proj_bias: three Linear layers `{attention}in_proj.{query,key,value}` instead."""
    tensors = dict(tensors)
    for leaf in ("weight", "bias"):
        packed = tensors.pop(f"{attention}in_proj_{leaf}", None)
        if packed is not None:
            for part, third in zip(("query", "key", "value"), np.split(np.asarray(packed, np.float32), 3, axis=0)):
                tensors[f"{attention}in_proj.{part}.{leaf}"] = third
    return tensors


def _siglip_tower(c: dict, tensors: Dict[str, np.ndarray], where: str, family: str, patch_kernel,
                  new_head: bool) -> tuple:
    """SigLIP's image tower, SigLIP2's too: (its ViTConfig fields, its params). `patch_kernel`
    reads the patch embedding: a convolution (SigLIP), or a Linear on flattened patches (SigLIP2)."""
    fields = _tower_fields(c, where, family)
    heads = fields["num_heads"]
    prefix = _vision_prefix(tensors)
    e = prefix + "embeddings."
    _require(tensors, e + "patch_embedding.weight", "the patch embedding", where, family)
    # Sig*ForImageClassification: its logits read the mean of the normalised tokens through
    # `classifier`; the tower's attention-pooling head is computed but never used.
    classification = new_head or "classifier.weight" in tensors
    uses_head = bool(c["vision_use_head"]) and not classification
    table = {
        "embedding/kernel": (e + "patch_embedding.weight", patch_kernel),
        "embedding/bias": (e + "patch_embedding.bias", None),
        # nn.Embedding (N, D): one row per patch; SigLIP has no class token.
        POSEMB_KEY: (e + "position_embedding.weight", lambda w: w[None]),
    }
    for i in range(fields["num_layers"]):
        torch_block(table, i, prefix + TOWER.on_disk.format(i=i), TOWER.parts, heads)
    torch_norm(table, ENCODER_NORM, prefix + "post_layernorm")
    if uses_head:
        h = prefix + "head."
        tensors = _split_in_proj(tensors, h + "attention.")
        torch_map_head(table, h, _SIGLIP_MAP_HEAD, heads)
    torch_dense(table, "head", "classifier")

    def unused(name: str) -> bool:
        # A full model's text tower and its logit_scale / logit_bias (the temperature and
        # bias of the image-text sigmoid loss) are not part of the image model; neither is the
        # pooling head the classifier computes and ignores.
        return (_is_buffer(name) or name.startswith("text_model.") or name in ("logit_scale", "logit_bias")
                or (classification and name.startswith(prefix + "head.")))

    # With the attention-pooling head the features are its output (pooler_output). Without
    # it transformers gives no pooled vector (pooler_output is None); the mean of the
    # normalised tokens is what the classifier classifies, so that is ours.
    fields.update(classifier="map" if uses_head else "gap", pixel_normalization="minus_one_to_one")
    return fields, rename(_drop(tensors, unused), table)


def _siglip(c: dict, hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    fields, params = _siglip_tower(c, tensors, where, "SigLIP", CONV, new_head)
    image_size = _grid_image_size(_side(c["image_size"], "image_size", where), params.get(POSEMB_KEY), 0,
                                  fields["patch_size"], where)
    return Mapped(fields, params, image_size, _labels(hf, params), int(c["num_channels"]))


def siglip_vision_model(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """SiglipVisionModel: features = the attention-pooling head's output (pooler_output). No
    transformers classifier loads a bare tower (SiglipForImageClassification reads a full
    SiglipModel's config): a new head reads these features."""
    return _siglip(_settings(hf, _SIGLIP_DEFAULTS), hf, tensors, where)


def siglip(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """A full SiglipModel (its vision tower), or SiglipForImageClassification (also what a new
    head on a SiglipModel is: new_head)."""
    return _siglip(_settings(_vision_config(hf), _SIGLIP_DEFAULTS), hf, tensors, where, new_head)


def _siglip2(c: dict, hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """SigLIP's tower taking patches at each image's own grid (NaFlex): the patch embedding a
    Linear on flattened patches (our convolution, on the image), and a learned G x G table
    that each image's grid resizes with torch's antialiased bilinear (keras_vit.model.naflex)."""
    side = int(round(int(c["num_patches"]) ** 0.5))
    if side * side != int(c["num_patches"]):
        raise UserError(f"{where}: num_patches={c['num_patches']} is not a square grid, which SigLIP2's position "
                        f"table is (transformers reshapes it to sqrt(num_patches) per side).")
    patch = _patch_size(c, where)
    fields, params = _siglip_tower(c, tensors, where, "SigLIP2", patch_linear_kernels(patch), new_head)
    fields.update(position_interpolation="bilinear_antialias")
    return Mapped(fields, params, (side * patch, side * patch), _labels(hf, params), int(c["num_channels"]),
                  dynamic_image_size=True)


def siglip2_vision_model(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """Siglip2VisionModel: features = the attention-pooling head's output (pooler_output); a new
    head reads them (as SigLIP's bare tower)."""
    return _siglip2(_settings(hf, _SIGLIP2_DEFAULTS), hf, tensors, where)


def siglip2(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """A full Siglip2Model (its vision tower), or Siglip2ForImageClassification (new_head: a new
    head on a Siglip2Model)."""
    return _siglip2(_settings(_vision_config(hf), _SIGLIP2_DEFAULTS), hf, tensors, where, new_head)


# --- AIMv2: RMSNorm everywhere, a gated MLP, no projection biases, its own attention pooling ---

# Aimv2VisionConfig's defaults (transformers 5.24).
_AIMV2_DEFAULTS = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=8,
                       num_channels=3, image_size=224, patch_size=14, hidden_act="silu", rms_norm_eps=1e-5,
                       qkv_bias=False, mlp_bias=False, use_head=True, is_native=False)


def _aimv2_tensors(tensors: Dict[str, np.ndarray], blocks: str, layers: int) -> Dict[str, np.ndarray]:
    """The gated MLP's gate_proj and up_proj as one Dense of twice the width, the gate first
    (mlp_activation="swiglu"), as DINOv3's."""
    tensors = dict(tensors)
    for i in range(layers):
        for leaf in ("weight", "bias"):
            gate, up = (f"{blocks.format(i=i)}{module}.{leaf}" for module in AIMV2.modules["fc1"])
            if gate in tensors and up in tensors:  # else both keep their names, for the loader to report
                tensors[up] = np.concatenate([tensors.pop(gate), tensors[up]], axis=0)
    return tensors


def _aimv2(c: dict, hf: dict, tensors: Dict[str, np.ndarray], where: str) -> Mapped:
    """Aimv2VisionModel, or a full Aimv2Model's vision tower and visual projection."""
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    if hidden % heads:
        raise UserError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}.")
    if c["hidden_act"] not in ("silu", "swish"):  # Aimv2MLP is act(x W_gate) * (x W_up)
        raise UserError(f"{where} has a gated MLP with hidden_act={c['hidden_act']!r}; keras-vit's gated MLP is "
                        f"SwiGLU (hidden_act='silu').")
    prefix = _vision_prefix(tensors)
    e, layers = prefix + "embeddings.", int(c["num_hidden_layers"])
    _require(tensors, e + "patch_embed.weight", "the patch embedding", where, "AIMv2")
    blocks = prefix + AIMV2.on_disk
    tensors = _aimv2_tensors(tensors, blocks, layers)
    native = bool(c["is_native"])
    uses_head = bool(c["use_head"])
    table = {
        "embedding/kernel": (e + "patch_embed.weight", CONV),
        "embedding/bias": (e + "patch_embed.bias", None),
        PATCH_NORM + "/scale": (e + "rms_norm.weight", None),
        POSEMB_KEY: (e + "position_embedding.weight", lambda w: w[None]),
        ENCODER_NORM + "/scale": (prefix + "rms_norm.weight", None),
    }
    for i in range(layers):
        torch_block(table, i, blocks.format(i=i), AIMV2.parts, heads)
    if uses_head:
        h = prefix + "head."
        table[attention_pool_key("probe")] = (h + "cls_token", None)
        for part, name in (("key", "k_proj"), ("value", "v_proj")):  # biases only with qkv_bias
            torch_dense(table, attention_pool_key(part), h + name, kernel=qkv_kernels(heads),
                        bias_transform=qkv_biases(heads))
        torch_dense(table, attention_pool_key("out"), h + "output_proj")
    projection = "visual_projection.weight" in tensors
    if projection:
        table["projection/kernel"] = ("visual_projection.weight", LINEAR)

    def unused(name: str) -> bool:
        # A full Aimv2Model's text tower, text projection and logit_scale are not part of the image model.
        return (_is_buffer(name) or name.startswith("text_model.") or name in ("logit_scale",)
                or name.startswith("text_projection."))

    params = rename(_drop(tensors, unused), table)
    biases = (("query", "key", "value", "out") if c["qkv_bias"] else ()) + (("mlp",) if c["mlp_bias"] else ())
    fields = dict(
        patch_size=_patch_size(c, where), hidden_size=hidden, mlp_dim=int(c["intermediate_size"]), num_heads=heads,
        num_layers=layers, layer_norm_epsilon=float(c["rms_norm_eps"]), norm="rms_norm", patch_norm=True,
        mlp_activation="swiglu", gelu_approximate=False, projection_biases=biases,
        # Without its head the tower gives no pooled vector (pooler_output is None): the mean of the
        # normalised tokens is ours, as for SigLIP without its head.
        classifier="attention_pool" if uses_head else "gap",
        # The native towers compute AIMv2's 2-D sin-cos table for each grid: MAE's layout, column first.
        position_embedding="sincos_2d" if native else "learned_1d",
        position_interpolation="bicubic", pixel_normalization="clip",
        projection_size=int(params["projection/kernel"].shape[-1]) if projection else None,
    )
    return Mapped(fields, params, _side(c["image_size"], "image_size", where), None, int(c["num_channels"]))


def aimv2_vision_model(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """Aimv2VisionModel: features = its attention pooling's output (pooler_output). transformers
    has no AIMv2 image classifier: a new head reads these features."""
    return _aimv2(_settings(hf, _AIMV2_DEFAULTS), hf, tensors, where)


def aimv2(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """A full Aimv2Model: its vision tower and visual projection (get_image_features); a new head
    reads those."""
    return _aimv2(_settings(_vision_config(hf), _AIMV2_DEFAULTS), hf, tensors, where)


def _clip(c: dict, hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """CLIP's tower (MetaCLIP 2's: CLIP's architecture trained on other data, transformers'
    MetaClip2 classes are CLIP's renamed, with the same tensor names). Its image classifier
    (CLIPForImageClassification; new_head: a new head on a full CLIPModel) reads the mean of the
    patch tokens as the last block leaves them: no post_layernorm, no projection."""
    family = "MetaCLIP 2" if hf.get("model_type", "").startswith("metaclip_2") else "CLIP"
    classification = new_head or "classifier.weight" in tensors
    fields = _tower_fields(c, where, family)
    heads = fields["num_heads"]
    prefix = _vision_prefix(tensors)
    e = prefix + "embeddings."
    _require(tensors, e + "class_embedding", "the class embedding", where, family)
    table = {
        "embedding/kernel": (e + "patch_embedding.weight", CONV),
        "embedding/bias": (e + "patch_embedding.bias", None),  # transformers' CLIP has none
        "cls": (e + "class_embedding", lambda w: w.reshape(1, 1, -1)),
        # nn.Embedding (N + 1, D): the class token's row, then one per patch.
        POSEMB_KEY: (e + "position_embedding.weight", lambda w: w[None]),
    }
    torch_norm(table, "pre_norm", prefix + "pre_layrnorm")  # sic: transformers' spelling
    for i in range(fields["num_layers"]):
        torch_block(table, i, prefix + TOWER.on_disk.format(i=i), TOWER.parts, heads)
    if classification:
        torch_dense(table, "head", "classifier")
    else:
        torch_norm(table, "pooled_norm", prefix + "post_layernorm")
        torch_dense(table, "projection", "visual_projection", bias=False)

    def unused(name: str) -> bool:
        # A full CLIPModel's text tower, text_projection and logit_scale (the contrastive
        # loss's temperature) are not part of the image model; nor, under the classifier, the
        # normalised class token and its projection, which it does not read.
        return (_is_buffer(name) or name.startswith("text_model.")
                or name in ("text_projection.weight", "logit_scale")
                or (classification and (name.startswith(prefix + "post_layernorm.")
                                        or name == "visual_projection.weight")))

    params = rename(_drop(tensors, unused), table)
    patch = fields["patch_size"]
    image_size = _grid_image_size(_side(c["image_size"], "image_size", where), params.get(POSEMB_KEY), 1, patch,
                                  where)
    projection = params.get("projection/kernel")
    # CLIPVisionModel's pooler_output is post_layernorm(class token); with the projection
    # (CLIPVisionModelWithProjection.image_embeds, CLIPModel.get_image_features) it is
    # that, times visual_projection: not normalised to unit length.
    fields.update(classifier="token", pre_norm=True, patch_bias="embedding/bias" in params,
                  final_norm="pooled", projection_size=None if projection is None else int(projection.shape[-1]),
                  pixel_normalization="clip")
    if classification:  # the class token attends, the mean of the patch tokens is read
        fields.update(classifier="gap", class_token=True, final_norm="none")
    return Mapped(fields, params, image_size, _labels(hf, params), int(c["num_channels"]))


def clip_vision_model(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """CLIPVisionModel and CLIPVisionModelWithProjection (MetaClip2's too). No transformers
    classifier loads a bare tower (CLIPForImageClassification reads a full CLIPModel's config):
    a new head reads its features."""
    return _clip(_settings(hf, _CLIP_DEFAULTS), hf, tensors, where)


def clip(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """A full CLIPModel (or MetaClip2Model): its vision tower and visual projection; or
    CLIPForImageClassification (MetaClip2's), which a new head on it is too (new_head)."""
    return _clip(_settings(_vision_config(hf), _CLIP_DEFAULTS), hf, tensors, where, new_head)


# --- dispatch ---

FAMILIES: Dict[str, Callable[[dict, Dict[str, np.ndarray], str], Mapped]] = {
    "vit": vit,
    "deit": deit,
    "dinov2": dinov2,
    "dinov2_with_registers": dinov2_with_registers,
    "dinov3_vit": dinov3_vit,
    "siglip_vision_model": siglip_vision_model,
    "siglip": siglip,
    "siglip2_vision_model": siglip2_vision_model,
    "siglip2": siglip2,
    "aimv2_vision_model": aimv2_vision_model,
    "aimv2": aimv2,
    "clip_vision_model": clip_vision_model,
    "clip": clip,
    # MetaClip2VisionConfig and MetaClip2Config have CLIP's defaults (transformers 5.24).
    "metaclip_2_vision_model": clip_vision_model,
    "metaclip_2": clip,
}
FAMILY_MODEL_TYPES = frozenset(FAMILIES)


# Models that share ViT's config but not its computation, refused with what to use instead.
_OTHER_MODELS = {
    "vit_hybrid": "HF's ViT-hybrid uses a BiT backbone whose layout keras-vit does not map; use the official "
                  "R50+B/16 .npz (weights='imagenet21k') instead",
    "vit_mae": "ViT-MAE checkpoints carry a decoder and fixed sin-cos position embeddings",
    "vit_msn": "ViT-MSN is not mapped",
}


def check_model_type(hf: dict, where: str) -> None:
    """A UserError unless config.json's model_type is a family read here."""
    model_type = hf.get("model_type")
    if model_type in _OTHER_MODELS:
        raise UserError(f"{where} is a {model_type!r} model, not a ViT: {_OTHER_MODELS[model_type]}. It cannot "
                        f"be loaded without changing what it computes.")
    if model_type not in FAMILIES:
        raise UserError(f"{where} has model_type={model_type!r}; keras-vit reads the HF checkpoints of "
                        f"{', '.join(sorted(FAMILIES))}.")


def map_family(hf: dict, tensors: Dict[str, np.ndarray], where: str, new_head: bool = False) -> Mapped:
    """The family adapter of config.json's model_type, applied. new_head: read a base without a
    head as the model transformers' image classifier of the family (*ForImageClassification) makes
    of it, its classifier new: what its pooling reads (DINOv2's class token beside the patch
    tokens' mean, SigLIP's and CLIP's means, no ViT pooler). Families with no such classifier,
    and bare towers no classifier loads, read as they are."""
    check_model_type(hf, where)
    return FAMILIES[hf["model_type"]](hf, tensors, where, new_head=new_head)
