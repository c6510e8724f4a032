"""The one description of a ViT's parts: every weight's checkpoint key and where it sits.

The layers are named as the official checkpoint's modules, so a weight's key
(`layout.variables_by_key`) already says where it sits; this module says it
once, for every family, and every rule that asks "is this the head?" or "how
deep is this?" reads it: layer-wise learning rates (training.optimization),
transfer's dropping of the classifier (training.transfer), the loaders' head
fitting (weights.npz) and masked-patch pre-training's frozen read-out
(keras_vit.tasks.masked_patch).

The groups, in the order the image flows through them:
  stem        patch or ResNet embedding, AIMv2's patch norm, class/distillation/
              register tokens, position embedding, CLIP's pre-norm (depth 0)
  block       encoder block i (depth i + 1)
  final_norm  the encoder's last LayerNorm (depth num_layers + 1)
  readout     what turns tokens into the image embedding: SigLIP's MAP head, AIMv2's
              attention pooling,
              CLIP's pooled norm and projection, the pre-logits layer
              (depth num_layers + 1)
  classifier  the head, and DeiT's second head on the distillation token
              (depth num_layers + 1)
A key whose root is in no table is refused with a traceback: a new family
adds its layers here, and tests/test_parts.py holds every family to it.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from keras_vit.weights.layout import (ATTENTION_POOL_ROOT, ENCODER_NORM, MAP_ROOT, PATCH_NORM, POSEMB_ROOT, block_of,
                                      variables_by_key)

STEM, BLOCK, FINAL_NORM, READOUT, CLASSIFIER = "stem", "block", "final_norm", "readout", "classifier"

# The first part of a key -> its group (keys under "Transformer/" are told apart below).
_ROOTS = {
    "embedding": STEM, PATCH_NORM: STEM, "cls": STEM, "dist_token": STEM, "reg_tokens": STEM, "pre_norm": STEM,
    "conv_root": STEM, "gn_root": STEM,  # the hybrid's ResNet ("block{s}/unit{u}/..." below)
    MAP_ROOT: READOUT, ATTENTION_POOL_ROOT: READOUT, "pooled_norm": READOUT, "projection": READOUT, "pre_logits": READOUT,
    "head": CLASSIFIER, "head_dist": CLASSIFIER,
}
# The classifiers' layers by checkpoint name: the head, and DeiT's second one on the distillation token.
CLASSIFIER_ROOTS = tuple(root for root, group in _ROOTS.items() if group == CLASSIFIER)
# ViT's layer handles (model.PARTS) -> their group; "encoder" holds the blocks and the final norm.
HANDLES = {
    "preprocessing": STEM, "padding": STEM, "resnet": STEM, "patch_embedding": STEM, "patch_norm": STEM,
    "class_token": STEM,
    "distillation_token": STEM, "position_embedding": STEM, "rotary_embedding": STEM, "register_tokens": STEM,
    "embedding_dropout": STEM, "pre_norm": STEM, "encoder": BLOCK,
    "pooling": READOUT, "pooled_norm": READOUT, "projection": READOUT, "pre_logits": READOUT,
    "head": CLASSIFIER,
}


@dataclasses.dataclass(frozen=True)
class WeightPart:
    """Where one weight sits: its official key, its group, its block (for "block")."""

    key: str
    group: str
    block: Optional[int] = None

    def depth(self, num_layers: int) -> int:
        """0 for the stem, i + 1 for block i, num_layers + 1 for the head side."""
        if self.group == STEM:
            return 0
        if self.group == BLOCK:
            return self.block + 1
        return num_layers + 1

    @property
    def decays(self) -> bool:
        """Whether weight decay applies: kernels only. Biases, norms, tokens,
        position tables, LayerScale and the MAP probe are left alone, as
        big_vision (decay on ".*/kernel") and timm (no decay below 2-D) do."""
        return self.key.endswith("/kernel")


def part_of(key: str) -> WeightPart:
    """The part of the weight under official checkpoint key `key`."""
    parts = key.split("/")
    block = block_of(key)
    if block is not None:
        return WeightPart(key, BLOCK, block)
    if key.startswith(ENCODER_NORM + "/"):
        return WeightPart(key, FINAL_NORM)
    if key.startswith(POSEMB_ROOT + "/"):
        return WeightPart(key, STEM)
    if parts[0] in _ROOTS:
        return WeightPart(key, _ROOTS[parts[0]])
    if parts[0].startswith("block") and len(parts) > 1 and parts[1].startswith("unit"):
        return WeightPart(key, STEM)  # a ResNet unit of the hybrid stem
    raise ValueError(f"keras_vit.weights.parts knows no part for checkpoint key {key!r}: add its layer to "
                     f"the tables in keras_vit/weights/parts.py.")


def is_classifier(key: str) -> bool:
    """Whether `key` is a classification head's weight (DeiT's second head
    included). Any key may be asked: a file's key no model has is for the
    loader to name, not for this test to refuse."""
    return key.split("/")[0] in CLASSIFIER_ROOTS


def weight_parts(vit) -> Dict[str, WeightPart]:
    """{variable path: WeightPart} for every weight of the ViT `vit`."""
    return {variable.path: part_of(key) for key, variable in variables_by_key(vit).items()}


# A text tower's own tables (keras_vit.model.text_tower), before its first block as the image stem is.
TEXT_STEM_KEYS = ("token_embedding", "position_embedding")


def text_weight_parts(tower) -> Dict[str, WeightPart]:
    """{variable path: WeightPart} for every weight of a TextTower: its token and position
    tables the stem, its blocks and final norm as the image tower's, its projection the readout."""
    from keras_vit.weights.layout import TEXT_ROOT, text_variables_by_key

    parts = {}
    for key, variable in text_variables_by_key(tower).items():
        own = key[len(TEXT_ROOT):]
        parts[variable.path] = WeightPart(own, STEM) if own in TEXT_STEM_KEYS else part_of(own)
    return parts


def layers_in(vit, groups) -> list:
    """The layers of `vit` (by their handles) whose group is in `groups`."""
    return [getattr(vit, handle) for handle, group in HANDLES.items()
            if group in groups and getattr(vit, handle, None) is not None]
