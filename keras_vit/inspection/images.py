"""Images in, model inputs out: the one place that knows what a model expects.

Every inspection function that takes `images` takes *pixels*: values in
0..255, NHWC (or NHW for grayscale), any size and 1, 3 or 4 channels. They are
resized to the model's `image_size`, converted to its `num_channels`, and
scaled to [-1, 1] unless the model scales them itself
(`include_preprocessing=True`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")

# ITU-R 601 luma, the weights PIL's convert("L") uses.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def find_images(paths, recursive=False):
    """Expands folders into the image files inside them (sorted).

    Files named explicitly are kept whatever their extension (a bad one is
    reported when it is read); inside a folder only files with an image
    extension are taken. Paths that do not exist are kept, so that the caller
    reports them by name.
    """
    found = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            found.extend(
                str(p) for p in sorted(path.glob(pattern))
                if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
            )
        else:
            found.append(str(path))
    return found


def load_image(path, image_size, num_channels=3):
    """Reads one image file as uint8 pixels (H, W, num_channels) at `image_size`.

    EXIF orientation is applied; the image is resized (bilinear, antialiased)
    to (height, width) without cropping. Raises OSError or ValueError for a
    missing, unreadable or truncated file.
    """
    from PIL import Image, ImageOps

    height, width = image_size
    with Image.open(path) as image:
        image.load()  # decode now: a truncated file fails here, not later
        image = ImageOps.exif_transpose(image)
        if num_channels == 1:
            image = image.convert("L")
        elif num_channels == 3:
            image = image.convert("RGB")
        else:
            raise ValueError(f"Cannot read image files for a model with {num_channels} channels.")
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(height, width, num_channels)


def load_images(paths, image_size, num_channels=3):
    """Reads several files; returns (pixels (B, H, W, C) uint8, paths read, failures).

    `failures` is a list of (path, reason) for files that could not be read;
    they are skipped, not raised.
    """
    height, width = image_size
    images, read, failures = [], [], []
    for path in paths:
        try:
            images.append(load_image(path, image_size, num_channels))
            read.append(path)
        except Exception as error:  # noqa: BLE001 - any decoder error means "skip this file"
            failures.append((str(path), _reason(path, error)))
    pixels = np.stack(images) if images else np.zeros((0, height, width, num_channels), np.uint8)
    return pixels, read, failures


def _reason(path, error):
    if not os.path.exists(path):
        return "no such file"
    if os.path.isdir(path):
        return "is a folder"
    return f"{type(error).__name__}: {error}"


def to_model_pixels(images, image_size, num_channels):
    """Pixels (B, H, W[, C]) in 0..255 -> float32 (B, height, width, num_channels) in 0..255."""
    x = np.asarray(images, dtype=np.float32)
    if x.ndim == 3:  # (B, H, W) grayscale
        x = x[..., None]
    if x.ndim != 4:
        raise ValueError(f"Expected images (B, H, W, C) or (B, H, W), got shape {x.shape}.")
    channels = x.shape[-1]
    if channels == 4:  # drop alpha
        x, channels = x[..., :3], 3
    if channels != num_channels:
        if channels == 1:
            x = np.repeat(x, num_channels, axis=-1)
        elif channels == 3 and num_channels == 1:
            x = (x @ _LUMA)[..., None]
        else:
            raise ValueError(f"Cannot convert {channels}-channel images for a {num_channels}-channel model.")
    if tuple(x.shape[1:3]) != tuple(image_size):
        from keras import ops

        x = np.asarray(ops.image.resize(x, tuple(image_size), interpolation="bilinear", antialias=True))
    return np.clip(x, 0.0, 255.0).astype(np.float32)


def model_inputs(model, images):
    """Pixels in 0..255 -> exactly what `model(...)` takes.

    Resized and channel-converted for the model; scaled to [-1, 1] unless the
    model has its own preprocessing layer.
    """
    x = to_model_pixels(images, model.image_size, model.num_channels)
    return x if model.include_preprocessing else x / 127.5 - 1.0
