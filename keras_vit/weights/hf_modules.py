"""transformers' names for the blocks of each family: on disk, and in memory under transformers 5.

`save_pretrained` writes (and keras_vit.weights.hf_families reads) the names
transformers 4 gave: "encoder.layer.N.attention.attention.query.weight".
transformers 5 renamed some families' modules in memory, converting the names
when it loads and saves ("layers.N.attention.q_proj" for ViT and DeiT,
"model.layer.N." for DINOv3's blocks), and peft saves the in-memory module
paths. So one table per block layout holds both: the HF reader reads the names
on disk, the peft writer (keras_vit.runs.adapter) writes transformers 5's, and
the peft reader (keras_vit.weights.peft) maps either back to the names on disk.
The in-memory names were read off transformers 5.24's nn.Linear modules and
its files (tests/test_peft.py loads what the writer writes with peft).
"""

from __future__ import annotations

from typing import Dict, Iterator, NamedTuple, Optional, Tuple, Union


class Blocks(NamedTuple):
    """Where block i sits under a model's prefix, and its parts (the key table's block parts,
    keras_vit.weights.layout.BLOCK_PARTS) within it."""

    on_disk: str  # block i's path in the files, "encoder.layer.{i}."
    parts: Dict[str, str]  # every part -> its name on disk
    in_memory: str  # block i's module path under transformers 5
    # Each projection -> its nn.Linear under transformers 5, or (gate, up) for a gated MLP's fc1,
    # which keras_vit holds as one projection of twice the width, the gate's outputs first.
    modules: Dict[str, Union[str, Tuple[str, str]]]
    fused_on_disk: bool = False  # the gated fc1's two modules are parts["fc1"]'s halves in the files

    def modules_of(self, i: int, part: str) -> Tuple[str, ...]:
        """Block i's transformers 5 modules of `part` (a projection): one, the (gate, up) pair of a
        gated fc1, or none."""
        module = self.modules.get(part, ())
        return tuple(self.in_memory.format(i=i) + m for m in ((module,) if isinstance(module, str) else module))

    def renames(self) -> Iterator[Tuple[str, str, Optional[int]]]:
        """(in-memory module, its tensor on disk, which half of it or None) of block {i}'s projections,
        where the two differ; last, the block's own paths ("layers.{i}.", "encoder.layer.{i}."),
        which rename the rest of a block (its norms, layer scales: an adapter's modules_to_save)."""
        for part, module in self.modules.items():
            if isinstance(module, str):
                pairs = [(module, self.parts[part], None)]
            elif self.fused_on_disk:
                pairs = [(half, self.parts[part], rows) for rows, half in enumerate(module)]
            else:  # the files hold the gate and up projections apart, under their own names
                pairs = [(half, half, None) for half in module]
            for in_memory, on_disk, rows in pairs:
                if (self.in_memory + in_memory, rows) != (self.on_disk + on_disk, None):
                    yield self.in_memory + in_memory, self.on_disk + on_disk, rows
        if self.in_memory != self.on_disk:
            yield self.in_memory, self.on_disk, None


_RENAMED = dict(query="attention.q_proj", key="attention.k_proj", value="attention.v_proj", out="attention.o_proj")
_TOWER = dict(query="self_attn.q_proj", key="self_attn.k_proj", value="self_attn.v_proj", out="self_attn.out_proj",
              fc1="mlp.fc1", fc2="mlp.fc2")

# ViT and DeiT: transformers 5 moved the blocks and renamed every projection.
VIT = Blocks("encoder.layer.{i}.", dict(
    query="attention.attention.query", key="attention.attention.key", value="attention.attention.value",
    out="attention.output.dense", norm1="layernorm_before", norm2="layernorm_after", fc1="intermediate.dense",
    fc2="output.dense"), "layers.{i}.", dict(_RENAMED, fc1="mlp.fc1", fc2="mlp.fc2"))
# DINOv2: the blocks stay, the attention's projections are renamed.
DINOV2 = Blocks("encoder.layer.{i}.", dict(
    VIT.parts, norm1="norm1", norm2="norm2", fc1="mlp.fc1", fc2="mlp.fc2", ls1="layer_scale1.lambda1",
    ls2="layer_scale2.lambda1"), "encoder.layer.{i}.", dict(_RENAMED, fc1="mlp.fc1", fc2="mlp.fc2"))
# Dinov2SwiGLUFFN: one weights_in on disk (the gate's rows first, as keras_vit's fc1), two
# modules in transformers 5.
DINOV2_SWIGLU = DINOV2._replace(parts=dict(DINOV2.parts, fc1="mlp.weights_in", fc2="mlp.weights_out"),
                                modules=dict(_RENAMED, fc1=("mlp.gate_proj", "mlp.up_proj"), fc2="mlp.down_proj"),
                                fused_on_disk=True)
# DINOv3: its names are transformers 5's already; the blocks sit under "model." in memory.
DINOV3 = Blocks("layer.{i}.", dict(
    _RENAMED, norm1="norm1", norm2="norm2", fc1="mlp.up_proj", fc2="mlp.down_proj", ls1="layer_scale1.lambda1",
    ls2="layer_scale2.lambda1"), "model.layer.{i}.", dict(_RENAMED, fc1="mlp.up_proj", fc2="mlp.down_proj"))
# Its gated MLP (use_gated_mlp): mlp.gate_proj and mlp.up_proj, on disk too, are keras_vit's one fc1.
DINOV3_GATED = DINOV3._replace(modules=dict(_RENAMED, fc1=("mlp.gate_proj", "mlp.up_proj"), fc2="mlp.down_proj"))
# CLIP, MetaCLIP 2, SigLIP and SigLIP2 towers: the same names on disk and in memory.
TOWER = Blocks("encoder.layers.{i}.", dict(_TOWER, norm1="layer_norm1", norm2="layer_norm2"),
               "encoder.layers.{i}.", _TOWER)
# AIMv2: always gated (ffn.gate_proj and ffn.up_proj, on disk too, are keras_vit's one fc1).
AIMV2 = Blocks("encoder.layers.{i}.", dict(
    query="attention.q_proj", key="attention.k_proj", value="attention.v_proj", out="attention.out_proj",
    norm1="rms_norm1", norm2="rms_norm2", fc1="ffn.up_proj", fc2="ffn.down_proj"),
    "encoder.layers.{i}.", dict(query="attention.q_proj", key="attention.k_proj", value="attention.v_proj",
                                out="attention.out_proj", fc1=("ffn.gate_proj", "ffn.up_proj"),
                                fc2="ffn.down_proj"))

# config.json's model_type -> its blocks (blocks_of: a DINOv2's and DINOv3's gated MLP).
BLOCKS = {
    "vit": VIT, "deit": VIT, "dinov2": DINOV2, "dinov2_with_registers": DINOV2, "dinov3_vit": DINOV3,
    "clip": TOWER, "clip_vision_model": TOWER, "metaclip_2": TOWER, "metaclip_2_vision_model": TOWER,
    "siglip": TOWER, "siglip_vision_model": TOWER, "siglip2": TOWER, "siglip2_vision_model": TOWER,
    "aimv2": AIMV2, "aimv2_vision_model": AIMV2,
}


def blocks_of(config: dict) -> Optional[Blocks]:
    """The blocks of an HF config.json (None for a model_type keras-vit does not read)."""
    blocks = BLOCKS.get(config.get("model_type"))
    if blocks is DINOV2 and config.get("use_swiglu_ffn"):
        return DINOV2_SWIGLU
    if blocks is DINOV3 and config.get("use_gated_mlp"):
        return DINOV3_GATED
    return blocks


# --- the classes a base loads as ------------------------------------------------------------------

class ModelClass(NamedTuple):
    """A transformers class a base loads as: where its encoder sits in its modules, and the
    classifier it has (head_kind: keras_vit's pooling of it, keras_vit.weights.hf_families; heads:
    our head keys -> its modules), None for none."""
    prefix: str
    head_kind: Optional[str] = None
    heads: Optional[dict] = None


_HEAD = {"head": "classifier"}
DISTILLED = "token+distillation"  # DeiT's two heads, averaged (keras_vit.layers.heads.DistillationHead)
UNNORMALISED_GAP = "gap+none"  # CLIP's classifier: the patch tokens' mean, before any norm (final_norm="none")
# Per config.json model_type, class name -> ModelClass. Each classifier reads what keras_vit's head
# of that kind reads (keras_vit.weights.hf_families, which reads a bare base with a new head as that
# classifier: map_family's new_head): ViT's and DeiT's the class token after the final norm, DINOv2's
# the class token beside the patch tokens' mean, SigLIP's the tokens' mean, CLIP's the patch tokens'
# mean before any norm. A bare tower (CLIPVisionModel, SiglipVisionModel) loads into no classifier,
# and DINOv3 and AIMv2 have none: their class has no head.
CLASSES = {
    "vit": {"ViTForImageClassification": ModelClass("vit.", "token", _HEAD), "ViTModel": ModelClass("")},
    "deit": {"DeiTForImageClassification": ModelClass("deit.", "token", _HEAD),
             "DeiTForImageClassificationWithTeacher": ModelClass(
                 "deit.", DISTILLED, {"head": "cls_classifier", "head_dist": "distillation_classifier"}),
             "DeiTModel": ModelClass("")},
    "dinov2": {"Dinov2ForImageClassification": ModelClass("dinov2.", "token_gap", _HEAD),
               "Dinov2Model": ModelClass("")},
    "dinov2_with_registers": {
        "Dinov2WithRegistersForImageClassification": ModelClass("dinov2_with_registers.", "token_gap", _HEAD),
        "Dinov2WithRegistersModel": ModelClass("")},
    "dinov3_vit": {"DINOv3ViTModel": ModelClass("")},
    "clip": {"CLIPForImageClassification": ModelClass("vision_model.", UNNORMALISED_GAP, _HEAD),
             "CLIPModel": ModelClass("vision_model.")},
    "clip_vision_model": {"CLIPVisionModel": ModelClass(""),
                          "CLIPVisionModelWithProjection": ModelClass("vision_model.")},
    "metaclip_2": {"MetaClip2ForImageClassification": ModelClass("vision_model.", UNNORMALISED_GAP, _HEAD),
                   "MetaClip2Model": ModelClass("vision_model.")},
    "metaclip_2_vision_model": {"MetaClip2VisionModel": ModelClass(""),
                                "MetaClip2VisionModelWithProjection": ModelClass("vision_model.")},
    "siglip": {"SiglipForImageClassification": ModelClass("vision_model.", "gap", _HEAD),
               "SiglipModel": ModelClass("vision_model.")},
    "siglip_vision_model": {"SiglipVisionModel": ModelClass("")},
    "siglip2": {"Siglip2ForImageClassification": ModelClass("vision_model.", "gap", _HEAD),
                "Siglip2Model": ModelClass("vision_model.")},
    "siglip2_vision_model": {"Siglip2VisionModel": ModelClass("")},
    "aimv2": {"Aimv2Model": ModelClass("vision_model.")},
    "aimv2_vision_model": {"Aimv2VisionModel": ModelClass("")},
}
MODULE_OF = {"clip_vision_model": "clip", "siglip_vision_model": "siglip",  # transformers.models.<module>
             "siglip2_vision_model": "siglip2", "metaclip_2_vision_model": "metaclip_2",
             "aimv2_vision_model": "aimv2"}
# Where the classes put the encoder: an adapter trained on a classifier names its modules under its
# prefix ("vit.layers.0..."), a bare base's files have none ("encoder.layer.0..."), and the reverse.
CLASS_PREFIXES = tuple(sorted({c.prefix for classes in CLASSES.values() for c in classes.values() if c.prefix},
                              key=len, reverse=True))
CLASSIFIER_MODULES = frozenset(m for classes in CLASSES.values() for c in classes.values()
                               for m in (c.heads or {}).values())


def head_kind(config) -> str:
    """The kind of head a ViTConfig's model has, as CLASSES names a classifier's."""
    if config.distillation_head:
        return DISTILLED
    return UNNORMALISED_GAP if config.final_norm == "none" and config.classifier == "gap" else config.classifier
