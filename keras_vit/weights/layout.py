"""The key table: where each of a model's variables lives in an official checkpoint.

The nested keys are written here once: the table of an encoder block's parts
(BLOCK_PARTS), the MAP head's (MAP_PARTS), the position tables' and the final
norm's roots; the rest are single top-level names ("embedding", "cls",
"head", ...). `variables_by_key` gives a model's variables their keys. The checkpoint
adapters (HF transformers, timm, keras-hub) only name their source's tensors
for these parts (keras_vit.weights.checkpoint's rules), the HF writer reads the
ViT adapter's names backwards, and keras_vit.weights.parts groups the keys.

The official `.npz` files of google-research/vision_transformer are flat
dicts keyed by Flax module paths, e.g.
"Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel".
Flax and Keras store dense/conv kernels the same way ((in, out) and
(kh, kw, in, out)) and the attention kernels with the same (D, heads,
head_dim) / (heads, head_dim, D) shapes, so porting is renaming only.

The official layout knows one position embedding, the learned 1-D table
("Transformer/posembed_input/pos_embedding"). The other learned kinds get
keys of our own in the same style (a learned_2d table under
"Transformer/posembed_input/{column,row,prefix}_embedding", a relative bias
under ".../MultiHeadDotProductAttention_1/relative_position_bias/
{relative,prefix}_bias"), so that transfer and resizing work for every kind;
the official `.npz` and HF writers refuse them (official_layout_error).
"""

from __future__ import annotations

import re
from typing import Dict, Optional

# --- the key table: every official key is written here, and only here ---

POSEMB_ROOT = "Transformer/posembed_input"  # the learned position tables (see _position_embedding)
POSEMB_KEY = POSEMB_ROOT + "/pos_embedding"
ENCODER_NORM = "Transformer/encoder_norm"
BLOCK_ROOT = "Transformer/encoderblock_"
# An encoder block's parts -> their keys under "Transformer/encoderblock_{i}/". Every
# checkpoint adapter names its source's tensors for these parts (keras_vit.weights.checkpoint's
# block rules), and the HF writer reads the same table backwards. ls1/ls2 (LayerScale) and the
# relative position bias are ours, in the official style.
BLOCK_PARTS = {
    "query": "MultiHeadDotProductAttention_1/query",
    "key": "MultiHeadDotProductAttention_1/key",
    "value": "MultiHeadDotProductAttention_1/value",
    "out": "MultiHeadDotProductAttention_1/out",
    "relative_bias": "MultiHeadDotProductAttention_1/relative_position_bias",
    "norm1": "LayerNorm_0",
    "norm2": "LayerNorm_2",
    "fc1": "MlpBlock_3/Dense_0",
    "fc2": "MlpBlock_3/Dense_1",
    "ls1": "ls1",
    "ls2": "ls2",
}
# SigLIP's attention-pooling head (big_vision's MAPHead_0), the same way.
MAP_ROOT = "MAPHead_0"
MAP_PARTS = {
    "probe": "probe",
    "query": "MultiHeadDotProductAttention_0/query",
    "key": "MultiHeadDotProductAttention_0/key",
    "value": "MultiHeadDotProductAttention_0/value",
    "out": "MultiHeadDotProductAttention_0/out",
    "norm": "LayerNorm_0",
    "fc1": "MlpBlock_0/Dense_0",
    "fc2": "MlpBlock_0/Dense_1",
}
# AIMv2's attention pooling (keras_vit.layers.AttentionPoolingHead) and patch norm: ours, in the same style.
ATTENTION_POOL_ROOT = "AttentionPool_0"
ATTENTION_POOL_PARTS = {"probe": "probe", "key": "key", "value": "value", "out": "out"}
PATCH_NORM = "embedding_norm"
_BLOCK_INDEX = re.compile(re.escape(BLOCK_ROOT) + r"(\d+)/")


def block_key(i: int, part: str) -> str:
    """The key (without its leaf: kernel, bias, scale) of part `part` of encoder block `i`."""
    return f"{BLOCK_ROOT}{i}/{BLOCK_PARTS[part]}"


def map_key(part: str) -> str:
    return f"{MAP_ROOT}/{MAP_PARTS[part]}"


def block_of(key: str) -> Optional[int]:
    """The encoder block a key belongs to, or None."""
    match = _BLOCK_INDEX.match(key)
    return int(match.group(1)) if match else None


def _norm(prefix, layer):
    """LayerNorm and GroupNorm: Flax calls gamma/beta scale/bias (RMSNorm has no beta)."""
    if layer.beta is None:
        return {f"{prefix}/scale": layer.gamma}
    return {f"{prefix}/scale": layer.gamma, f"{prefix}/bias": layer.beta}


def _dense(prefix, layer):
    kernel = _stored_kernel(layer)
    if layer.bias is None:  # CLIP's bias-free patch embedding and projection
        return {f"{prefix}/kernel": kernel}
    return {f"{prefix}/kernel": kernel, f"{prefix}/bias": layer.bias}


def _stored_kernel(layer):
    """The kernel variable of a Dense/EinsumDense layer: for a quantised one (ViTConfig.quantization)
    the integers it stores (int4's `kernel` is unpacked on each read, a tensor, not a variable)."""
    if not getattr(layer, "quantization_mode", None):
        return layer.kernel
    return next(v for v in layer.weights if v.path.rsplit("/", 1)[-1] == "kernel")


# A LoRA update's factors sit beside the kernel they update (ours, in the official style:
# ".../query/lora_a"); keras_vit.model.lora merges them into it.
LORA_LEAVES = ("lora_a", "lora_b")


def _low_rank(prefix, update):
    return {f"{prefix}/lora_a": update.lora_a, f"{prefix}/lora_b": update.lora_b}


def is_lora_key(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in LORA_LEAVES


def _optional(prefix, layer, read):
    return read(prefix, layer) if layer is not None else {}


def _map_head(head):
    """SigLIP's attention-pooling head, under big_vision's MAPHead_0 names."""
    out = {map_key("probe"): head.probe, **_norm(map_key("norm"), head.norm)}
    for name in ("query", "key", "value", "out"):
        out.update(_dense(map_key(name), getattr(head, name)))
    out.update(_dense(map_key("fc1"), head.mlp.dense_0))
    out.update(_dense(map_key("fc2"), head.mlp.dense_1))
    return out


def attention_pool_key(part: str) -> str:
    return f"{ATTENTION_POOL_ROOT}/{ATTENTION_POOL_PARTS[part]}"


def _attention_pool(head):
    """AIMv2's attention pooling: its query (probe), key, value and output projections."""
    out = {attention_pool_key("probe"): head.probe}
    for name in ("key", "value", "out"):
        out.update(_dense(attention_pool_key(name), getattr(head, name)))
    return out


def _head(head):
    """The classifier: one Dense ("head"), or DeiT's pair ("head", "head_dist")."""
    if hasattr(head, "head_dist"):
        return {**_dense("head", head.head), **_dense("head_dist", head.head_dist)}
    return _dense("head", head)


def _resnet(stem) -> Dict[str, object]:
    out = {"conv_root/kernel": stem.conv_root.kernel, **_norm("gn_root", stem.gn_root)}
    for key, unit in zip(stem.checkpoint_keys, stem.units):
        for i, (conv, norm) in enumerate(((unit.conv1, unit.gn1), (unit.conv2, unit.gn2), (unit.conv3, unit.gn3)), 1):
            out[f"{key}/conv{i}/kernel"] = conv.kernel
            out.update(_norm(f"{key}/gn{i}", norm))
        if unit.needs_projection:
            out[f"{key}/conv_proj/kernel"] = unit.conv_proj.kernel
            out.update(_norm(f"{key}/gn_proj", unit.gn_proj))
    return out


def _position_embedding(layer):
    """The learned absolute position tables: "learned_1d" (official), "learned_2d"
    (ours); "sincos_2d" has none, and "relative" / "none" have no layer."""
    names = ("pos_embedding", "column_embedding", "row_embedding", "prefix_embedding")
    return {f"{POSEMB_ROOT}/{name}": getattr(layer, name) for name in names
            if getattr(layer, name, None) is not None}


def official_layout_error(model, writer: str) -> str:
    """Why `model` cannot be written by `writer` (an official-layout format), or "" if it can."""
    kind = model.config.position_embedding
    if model.config.lora_rank:
        return (f"{model.name} carries LoRA updates, which {writer} cannot hold: merge them first, "
                f"keras_vit.merge_lora(model) (a training run's model.keras is already merged).")
    if model.config.has_class_token and model.config.classifier not in ("token", "token_gap"):
        return (f"{model.name} has a class token it does not read out (classifier={model.config.classifier!r}), "
                f"which {writer} cannot say (a class token there is read out): save it as .keras instead, e.g. "
                f"model.save('model.keras').")
    if kind == "learned_1d":
        return ""
    return (f"{model.name} uses position_embedding={kind!r}, which {writer} cannot hold (it has the learned 1-D "
            f"table only): save it as .keras instead, e.g. model.save('model.keras') (a training run already "
            f"writes WORKDIR/model.keras).")


def variables_by_key(model) -> Dict[str, object]:
    """{official checkpoint key: Keras variable} for every weight of `model`."""
    out = {}
    if model.resnet is not None:
        out.update(_resnet(model.resnet))
    out.update(_dense("embedding", model.patch_embedding.projection))
    out.update(_optional(PATCH_NORM, model.patch_norm, _norm))
    if model.class_token is not None:
        out["cls"] = model.class_token.cls
    if model.distillation_token is not None:
        out["dist_token"] = model.distillation_token.tokens
    if model.register_tokens is not None:
        out["reg_tokens"] = model.register_tokens.tokens
    out.update(_position_embedding(model.position_embedding))
    out.update(_optional("pre_norm", model.pre_norm, _norm))
    out.update(_blocks(model.encoder))
    out.update(_optional(ENCODER_NORM, model.encoder.encoder_norm, _norm))
    if model.config.classifier == "map":
        out.update(_map_head(model.pooling))
    elif model.config.classifier == "attention_pool":
        out.update(_attention_pool(model.pooling))
    out.update(_optional("pooled_norm", model.pooled_norm, _norm))
    if model.projection is not None:
        out["projection/kernel"] = model.projection.kernel
    out.update(_optional("pre_logits", model.pre_logits, _dense))
    if model.head is not None:
        out.update(_head(model.head))
    return out


def _blocks(encoder) -> Dict[str, object]:
    """{key: variable} of an Encoder's blocks (the image tower's and the text tower's alike)."""
    out = {}
    for i, block in enumerate(encoder.blocks):
        attention = block.attention
        out.update(_norm(block_key(i, "norm1"), block.attention_norm))
        for name in ("query", "key", "value", "out"):
            out.update(_dense(block_key(i, name), getattr(attention, name)))
            out.update(_optional(block_key(i, name), getattr(attention, f"{name}_lora"), _low_rank))
        relative = attention.relative_position_bias
        if relative is not None:  # not in the official layout (position_embedding="relative")
            bias = block_key(i, "relative_bias")
            out[f"{bias}/relative_bias"] = relative.relative_bias
            if relative.prefix_bias is not None:
                out[f"{bias}/prefix_bias"] = relative.prefix_bias
        out.update(_norm(block_key(i, "norm2"), block.mlp_norm))
        out.update(_dense(block_key(i, "fc1"), block.mlp.dense_0))
        out.update(_dense(block_key(i, "fc2"), block.mlp.dense_1))
        out.update(_optional(block_key(i, "fc1"), block.mlp.dense_0_lora, _low_rank))
        out.update(_optional(block_key(i, "fc2"), block.mlp.dense_1_lora, _low_rank))
        for name, scale in (("ls1", block.attention_scale), ("ls2", block.mlp_scale)):
            if scale is not None:  # LayerScale (DINOv2): not in the official layout
                out[f"{block_key(i, name)}/scale"] = scale.scale
    return out


TEXT_ROOT = "text/"  # a text tower's keys: its own, and the image tower's table under this prefix


def text_variables_by_key(tower) -> Dict[str, object]:
    """{key: variable} for every weight of a TextTower (keras_vit.model.text_tower): the token
    and position tables, the blocks and final norm under the image tower's names, the projection."""
    out = {"token_embedding": tower.embedding.token_table, "position_embedding": tower.embedding.position_table}
    out.update(_blocks(tower.encoder))
    out.update(_norm(ENCODER_NORM, tower.encoder.encoder_norm))
    out.update(_optional("projection", tower.projection, _dense))
    return {TEXT_ROOT + key: variable for key, variable in out.items()}
