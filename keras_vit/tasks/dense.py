"""What the per-pixel Tasks share: a ViT under a dense head (keras_vit.layers.dense_heads) in a
PatchGridModel, the head chosen by name, the backbone frozen or not.

    --head linear   LinearHead on the last block's patch tokens (with --freeze-backbone: the
                    linear probe of DINOv2 and DINOv3)
    --head dpt      DPTHead on four blocks evenly through the encoder (dpt_blocks)

SegmentationTask (segmentation.py) and DepthTask (depth.py) differ in their outputs, loss and
metrics only.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_vit.errors import UserError
from keras_vit.layers.dense_heads import DPTHead, LinearHead, dpt_blocks
from keras_vit.model import ViT
from keras_vit.model.patch_grid import PatchGridModel
from keras_vit.tasks.base import Task
from keras_vit.variants import get_variant

HEADS = ("linear", "dpt")


def dpt_features(hidden_size: int) -> int:
    """The DPT decoder's width for an encoder's: a quarter of it, 16 to 256 (Depth Anything's
    ViT-S decoder is 64 wide, ViT-L's 256)."""
    return int(min(256, max(16, hidden_size // 4)))


class DenseTask(Task):
    """A Task whose model gives `outputs` channels per pixel (set by the subclass's build)."""

    adapts_encoder = True  # LoRA adapts the ViT inside the PatchGridModel; the head trains in full

    def __init__(self, head: str = "linear", freeze_backbone: bool = False):
        if head not in HEADS:
            raise UserError(f"--head {head}: choose one of {', '.join(HEADS)}.")
        self.head, self.freeze_backbone = head, bool(freeze_backbone)

    @classmethod
    def from_train_config(cls, config):
        if config.freeze_backbone and config.lora_rank:
            raise UserError("--freeze-backbone trains the head alone, and --lora-rank adapts the backbone: give "
                            "one of them.")
        return cls(head=config.head, freeze_backbone=config.freeze_backbone)

    def dense_model(self, plan, outputs: int) -> PatchGridModel:
        vit = ViT(get_variant(plan.model), image_size=plan.image_size, include_top=False,
                  num_channels=plan.num_channels)
        stride, width = vit.config.total_stride, vit.config.hidden_size
        if self.head == "dpt":
            head = DPTHead(outputs, stride, dpt_features(width), name="dpt_head")
            blocks = dpt_blocks(vit.config.num_layers)
        else:
            head, blocks = LinearHead(outputs, stride, name="linear_head"), None
        if self.freeze_backbone:
            vit.trainable = False
        return PatchGridModel(vit, head, blocks=blocks, name=f"{self.name}_{vit.name}")

    # --- outputs at each image's own size (serving_bytes, predict --out) ---

    # {output: the value past an image's own size where a batch of sizes is padded to its largest}
    padding = {}

    def at_size(self, outputs, height, width):
        """One image's served outputs (no batch axis; tf tensors, at the model's size) at
        height x width: each subclass says how its outputs resize."""
        raise NotImplementedError

    def write_outputs(self, outputs, stem: str, height: int, width: int) -> list:
        """Writes one image's outputs at its own size as files named stem + a suffix -> their paths."""
        raise NotImplementedError


def float32_outputs(model, images, training):
    return keras.ops.cast(model(images, training=training), "float32")


def resized(value, height, width):
    """(h, w, c) or (h, w) float -> the same at height x width, bilinear (the identity at its own size)."""
    value = tf.convert_to_tensor(value, tf.float32)
    flat = value.shape.rank == 2
    out = tf.image.resize(value[..., None] if flat else value, tf.stack([height, width]), method="bilinear")
    return out[..., 0] if flat else out


def save_png(path: str, pixels: np.ndarray) -> str:
    from PIL import Image

    Image.fromarray(pixels).save(path)
    return path
