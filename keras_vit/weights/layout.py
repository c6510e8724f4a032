"""Where each of a model's variables lives in an official checkpoint.

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

from typing import Dict


def _norm(prefix, layer):
    """LayerNorm and GroupNorm: Flax calls gamma/beta scale/bias."""
    return {f"{prefix}/scale": layer.gamma, f"{prefix}/bias": layer.beta}


def _dense(prefix, layer):
    if layer.bias is None:  # CLIP's bias-free patch embedding and projection
        return {f"{prefix}/kernel": layer.kernel}
    return {f"{prefix}/kernel": layer.kernel, f"{prefix}/bias": layer.bias}


def _optional(prefix, layer, read):
    return read(prefix, layer) if layer is not None else {}


def _map_head(head):
    """SigLIP's attention-pooling head, under big_vision's MAPHead_0 names."""
    out = {"MAPHead_0/probe": head.probe, **_norm("MAPHead_0/LayerNorm_0", head.norm)}
    for name in ("query", "key", "value", "out"):
        out.update(_dense(f"MAPHead_0/MultiHeadDotProductAttention_0/{name}", getattr(head, name)))
    out.update(_dense("MAPHead_0/MlpBlock_0/Dense_0", head.mlp.dense_0))
    out.update(_dense("MAPHead_0/MlpBlock_0/Dense_1", head.mlp.dense_1))
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
    return {f"Transformer/posembed_input/{name}": getattr(layer, name) for name in names
            if getattr(layer, name, None) is not None}


def official_layout_error(model, writer: str) -> str:
    """Why `model` cannot be written by `writer` (an official-layout format), or "" if it can."""
    kind = model.config.position_embedding
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
    if model.class_token is not None:
        out["cls"] = model.class_token.cls
    if model.distillation_token is not None:
        out["dist_token"] = model.distillation_token.tokens
    if model.register_tokens is not None:
        out["reg_tokens"] = model.register_tokens.tokens
    out.update(_position_embedding(model.position_embedding))
    out.update(_optional("pre_norm", model.pre_norm, _norm))
    for i, block in enumerate(model.encoder.blocks):
        prefix = f"Transformer/encoderblock_{i}"
        attention = block.attention
        out.update(_norm(f"{prefix}/LayerNorm_0", block.attention_norm))
        for name in ("query", "key", "value", "out"):
            out.update(_dense(f"{prefix}/MultiHeadDotProductAttention_1/{name}", getattr(attention, name)))
        relative = attention.relative_position_bias
        if relative is not None:  # not in the official layout (position_embedding="relative")
            bias = f"{prefix}/MultiHeadDotProductAttention_1/relative_position_bias"
            out[f"{bias}/relative_bias"] = relative.relative_bias
            if relative.prefix_bias is not None:
                out[f"{bias}/prefix_bias"] = relative.prefix_bias
        out.update(_norm(f"{prefix}/LayerNorm_2", block.mlp_norm))
        out.update(_dense(f"{prefix}/MlpBlock_3/Dense_0", block.mlp.dense_0))
        out.update(_dense(f"{prefix}/MlpBlock_3/Dense_1", block.mlp.dense_1))
        for name, scale in (("ls1", block.attention_scale), ("ls2", block.mlp_scale)):
            if scale is not None:  # LayerScale (DINOv2): not in the official layout
                out[f"{prefix}/{name}/scale"] = scale.scale
    out.update(_optional("Transformer/encoder_norm", model.encoder.encoder_norm, _norm))
    if model.config.classifier == "map":
        out.update(_map_head(model.pooling))
    out.update(_optional("pooled_norm", model.pooled_norm, _norm))
    if model.projection is not None:
        out["projection/kernel"] = model.projection.kernel
    out.update(_optional("pre_logits", model.pre_logits, _dense))
    if model.head is not None:
        out.update(_head(model.head))
    return out
