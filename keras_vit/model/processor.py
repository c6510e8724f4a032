"""Image files as an image-text checkpoint's own image processor reads them.

transformers' processors differ by family, and the difference is visible in zero-shot scores:
CLIP's resizes the shorter side and crops the centre square (a wide photo loses its sides),
SigLIP's resizes the whole image to the square (a wide photo is squeezed), SigLIP2's keeps each
image's aspect at its own patch grid (NaFlex). The rule is read from preprocessor_config.json
beside the weights; the scaling after it is the image tower's own (keras_vit.images.model_inputs).
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from keras_vit.images import decode, model_inputs, resize, to_model_pixels, unreadable_reason


class ImageProcessor:
    """`read(paths)` -> (images as the tower takes them: an array, or a list of arrays of their own
    sizes for a NaFlex tower; the paths read; [(path, reason)] of those that could not be)."""

    def __init__(self, tower, shortest_edge: Optional[int] = None, crop: Optional[Tuple[int, int]] = None,
                 max_num_patches: Optional[int] = None):
        self.tower = tower
        self.shortest_edge = shortest_edge
        self.crop = crop
        self.max_num_patches = max_num_patches

    def pixels(self, image: np.ndarray) -> np.ndarray:
        """Decoded uint8 pixels (H, W, C) -> float32 0..255 at the size the processor gives them."""
        height, width = image.shape[:2]
        if getattr(self.tower, "dynamic_image_size", False):
            from keras_vit.model.naflex import size_rule

            return resize(image, size_rule(self.tower, self.max_num_patches)(height, width))
        if self.shortest_edge and self.crop:
            scale = self.shortest_edge / min(height, width)
            size = (max(self.crop[0], round(height * scale)), max(self.crop[1], round(width * scale)))
            image = resize(image, size)
            top, left = (size[0] - self.crop[0]) // 2, (size[1] - self.crop[1]) // 2
            image = image[top:top + self.crop[0], left:left + self.crop[1]]
        return resize(image, self.tower.image_size)

    def read(self, paths):
        decoded, read, failures = [], [], []
        for path in paths:
            try:
                decoded.append(decode(path, self.tower.num_channels))
            except Exception as error:  # noqa: BLE001 - any decoder error means "skip this file"
                failures.append((str(path), unreadable_reason(path, error)))
                continue
            read.append(str(path))
        return self.inputs(decoded), read, failures

    def inputs(self, decoded):
        """Decoded pixels (a list of (H, W[, C]) uint8 arrays, or one (N, H, W[, C]) array) -> what
        the tower takes: an array, or a list of arrays of their own sizes for a NaFlex tower."""
        channels = self.tower.num_channels
        images = [np.asarray(model_inputs(self.tower, self.pixels(to_model_pixels(
            np.asarray(image)[None], np.shape(image)[:2], channels)[0])[None]))[0] for image in decoded]
        if getattr(self.tower, "dynamic_image_size", False):
            return images
        return np.stack(images) if images else np.zeros((0, *self.tower.image_size, channels), np.float32)


def read_processor(model) -> ImageProcessor:
    """The ImageProcessor of an image-text model's folder (`model.directory`): its
    preprocessor_config.json, or the tower's own size and scaling without one."""
    from keras_vit.weights.checkpoint import read_json

    path = os.path.join(getattr(model, "directory", "") or "", "preprocessor_config.json")
    settings = read_json(path) if os.path.isfile(path) else {}
    size, crop = settings.get("size") or {}, settings.get("crop_size")
    shortest = size.get("shortest_edge") if isinstance(size, dict) else None
    if isinstance(crop, dict):
        crop = (int(crop["height"]), int(crop["width"]))
    elif isinstance(crop, int):
        crop = (crop, crop)
    centre_crop = settings.get("do_center_crop", False) and crop is not None and shortest is not None
    return ImageProcessor(model.image_tower, int(shortest) if centre_crop else None, crop if centre_crop else None,
                          settings.get("max_num_patches"))


__all__: List[str] = ["ImageProcessor", "read_processor"]
