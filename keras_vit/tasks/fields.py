"""The fields of an example and what each kind of field undergoes on its way to a batch.

A Task declares the fields it reads (`Task.fields`: {name: kind}); a source
decodes an example into named fields; the input pipeline keeps the Task's,
moves every spatial field with its image through the plan's geometry, and
batches them. One table of kinds, read by the pipeline (training/data.py),
the augmentation (training/augment.py) and the plan's checks:

    kind     per example            geometry (crop, flip, resize, affine)   mixed by Mixup/CutMix
    image    (H, W, C) float        bilinear, photometric ops too           yes
    label    () int32               -                                       yes (mix_label)
    mask     (H, W) int32 classes   nearest; pixels brought in: IGNORE      no
    depth    (H, W) float32         nearest; pixels brought in: 0 (none)    no
    text     () string              -                                       no

While augmented, a mask or depth map travels as (H, W, 1) float32 beside the
image (every class id below 2**24 is exact in float32) and is cast back last.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import tensorflow as tf

IGNORE = 255  # a mask's value for pixels no annotation covers (brought in by a crop, padding): no loss, no metric


@dataclasses.dataclass(frozen=True)
class FieldKind:
    name: str
    dtype: tf.DType
    spatial: bool  # an (H, W) map that moves with the image's geometry
    fill: float = 0.0  # a spatial field's value where a geometric op brings pixels in
    mixable: bool = False  # Mixup/CutMix can mix two examples' values
    interpolation: Optional[str] = None  # a spatial field's resampling: "bilinear" (images) or "nearest"

    def blank(self, size, channels: int = 1) -> tf.Tensor:
        """The value of a padding example (weight 0): zeros, a mask all IGNORE, an empty text."""
        if self.name == "image":
            return tf.zeros([size[0], size[1], channels])
        if self.spatial:
            return tf.fill([size[0], size[1]], tf.cast(self.fill, self.dtype))
        return tf.zeros([], self.dtype) if self.dtype != tf.string else tf.constant("")


IMAGE = FieldKind("image", tf.float32, spatial=True, mixable=True, interpolation="bilinear")
LABEL = FieldKind("label", tf.int32, spatial=False, mixable=True)
MASK = FieldKind("mask", tf.int32, spatial=True, fill=float(IGNORE), interpolation="nearest")
DEPTH = FieldKind("depth", tf.float32, spatial=True, fill=0.0, interpolation="nearest")
TEXT = FieldKind("text", tf.string, spatial=False)

KINDS = {kind.name: kind for kind in (IMAGE, LABEL, MASK, DEPTH, TEXT)}

CLASSIFICATION_FIELDS = {"image": IMAGE, "label": LABEL}


def kind_names(fields: Dict[str, FieldKind]) -> Dict[str, str]:
    """{name: kind name}: the plan's record of the fields (config.json)."""
    return {name: kind.name for name, kind in fields.items()}


def to_travel(name: str, kind: FieldKind, value) -> tf.Tensor:
    """A decoded field as the augmentation carries it: spatial maps (H, W, 1) float32."""
    if kind.spatial and name != "image":
        value = tf.cast(value, tf.float32)
        return value[..., None] if value.shape.rank == 2 else value
    return value


def from_travel(kind: FieldKind, value) -> tf.Tensor:
    """Back to the field's batch form: a mask (H, W) int32, a depth map (H, W) float32."""
    if kind.spatial and kind is not IMAGE:
        value = value[..., 0]
        return tf.cast(tf.round(value), kind.dtype) if kind.dtype.is_integer else value
    return value


def resize_map(value, size, kind: FieldKind) -> tf.Tensor:
    """A travelling (H, W, 1) mask or depth map at `size`, nearest (class ids and
    depths are never blended); the identity at its own size."""
    if tuple(value.shape[-3:-1]) == tuple(size):
        return value
    return tf.image.resize(value, size, method="nearest")
