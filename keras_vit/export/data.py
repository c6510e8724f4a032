"""Images for calibration and validation, shaped for the model being exported.

Every artifact takes what `serving_default` takes: float32 (N, H, W, C) pixels
in 0..255. Whatever the user gives (the bundled MNIST digits, an `.npz`, a
folder of images, arrays) is brought to that shape here, once.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib
from typing import Iterator, Optional, Tuple

import numpy as np

from keras_vit.utils import console as _console
from keras_vit import images as images_lib
from keras_vit.data import mnist5k
from keras_vit.utils import storage
from keras_vit.errors import UserError


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


def mnist_digits(seed: int = 0, split: str = "all") -> Images:
    """The 5,000 MNIST digits shipped inside the package, read by keras_vit.data.mnist5k.

    split: "test" (the 1,000 held-out digits the trainer evaluates on; what
    `--data mnist` validates on), "train" (the other 4,000) or "all" (the
    5,000, shuffled with `seed`: the file is sorted by class).
    """
    if split in ("test", "train"):
        (train_images, train_labels), (test_images, test_labels) = mnist5k.split()
        if split == "test":
            return Images(test_images.astype(np.float32), test_labels.astype(np.int64),
                          "mnist (the 1,000 held-out test digits)")
        return Images(train_images.astype(np.float32), train_labels.astype(np.int64),
                      "mnist (the 4,000 training digits)")
    if split != "all":
        raise UserError(f"split must be 'test', 'train' or 'all', not {split!r}.")
    images, labels = mnist5k.read()
    order = np.random.default_rng(seed).permutation(len(labels))
    return Images(images[order].astype(np.float32), labels[order].astype(np.int64), "mnist (the 5,000 bundled digits)")


def read(spec, image_size: Optional[Tuple[int, int]] = None, num_channels: Optional[int] = None) -> Images:
    """Images as given, at their own size.

    spec: "mnist"; a path to an `.npz` (arrays `images` or `x`, optional
    `labels` or `y`) or `.npy`; a folder of images (one sub-folder per class
    gives labels, in sorted order); an array; a tuple (images, labels); an
    `Images`. image_size, num_channels: image files are decoded
    and resized to them directly (as `keras-vit predict` reads them).
    """
    if isinstance(spec, Images):
        data = spec
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        data = Images(np.asarray(spec[0]), None if spec[1] is None else np.asarray(spec[1]))
    elif isinstance(spec, np.ndarray):
        data = Images(spec)
    elif isinstance(spec, (str, os.PathLike)):
        data = _load_path(os.fspath(spec), image_size, num_channels)
    else:
        raise UserError(f"Cannot read images from {type(spec).__name__}: give 'mnist', a path, an array "
                        f"or (images, labels).")
    return Images(data.images, _labels(data), data.source)


def load(spec, image_size: Tuple[int, int], num_channels: int) -> Images:
    """Images for a model of `image_size` (height, width) and `num_channels` (see `read`)."""
    data = read(spec, image_size, num_channels)
    return Images(conform(data.images, image_size, num_channels), data.labels, data.source)


def _labels(data: Images):
    if data.labels is None:
        return None
    labels = np.asarray(data.labels).reshape(-1)
    if len(labels) != len(data.images):
        raise UserError(f"{len(data.images)} images but {len(labels)} labels.")
    return labels.astype(np.int64)


def _load_path(path: str, image_size=None, num_channels=None) -> Images:
    if path.lower() == "mnist":
        return mnist_digits(split="test")  # never the digits the trainer learns from
    if not storage.exists(path):
        raise FileNotFoundError(f"Image data {path!r} does not exist (give 'mnist', an .npz/.npy file or a folder).")
    if storage.isdir(path):
        return _load_folder(path, image_size, num_channels)
    if path.endswith(".npy"):
        return Images(_read_arrays(path), None, path)
    if path.endswith(".npz"):
        arrays = _read_arrays(path)
        images = next((arrays[k] for k in ("images", "x", "x_test") if k in arrays), None)
        labels = next((arrays[k] for k in ("labels", "y", "y_test") if k in arrays), None)
        if images is None:
            raise UserError(f"{path} has no 'images' (or 'x') array; it has {sorted(arrays)}.")
        return Images(images, labels, path)
    raise UserError(f"Cannot read images from {path!r}: expected 'mnist', .npz, .npy or a folder of images.")


def _read_arrays(path: str):
    """The array of a `.npy` file, or {name: array} of an `.npz`; a UserError
    for a file numpy cannot read (truncated, corrupt, pickled objects)."""
    try:
        with storage.open(path, "rb") as f:
            loaded = np.load(f, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                return loaded
            with loaded:  # an .npz reads its members lazily: read them while the file is open
                return {name: loaded[name] for name in loaded.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as error:  # what numpy and zipfile raise for bad data
        raise UserError(f"{path!r} is not a readable {os.path.splitext(path)[1]} file ({type(error).__name__}: "
                        f"{error}): it may be truncated or corrupt.") from error


def _load_folder(path: str, size=None, num_channels=None) -> Images:
    """A folder of images, or of class sub-folders (sorted names = class ids).

    Decoded by keras_vit.images (what training, predict and inspect see);
    files that do not decode are left out with one warning naming them
    (`keras-vit: warning: ...` on stderr, as training's).
    """
    entries = _folder_entries(path)
    data = _decode_entries(entries, path, size, num_channels)
    if data is None:
        raise UserError(f"None of the {len(entries)} images under {path} could be decoded.")
    return data


def _folder_entries(path: str) -> list:
    """[(file, class id or None)] of a folder of images or of class sub-folders."""
    classes = images_lib.class_folders(path)
    entries = ([(f, i) for i, c in enumerate(classes) for f in images_lib.list_images(storage.join(path, c))]
               if classes else [(f, None) for f in images_lib.list_images(path)])
    if not entries:
        raise UserError(f"No images ({', '.join(images_lib.IMAGE_EXTENSIONS)}) under {path}.")
    return entries


def _decode_entries(entries: list, path: str, size=None, num_channels=None) -> Optional[Images]:
    """The images of `entries` decoded and each resized once, to `size` when known (else to the
    first one's); None when none decodes."""
    arrays, labels, failures = [], [], []
    for f, label in entries:
        try:
            arrays.append(images_lib.decode(f, num_channels or 3))
            labels.append(label)
        except Exception as error:  # noqa: BLE001 - any decoder error: leave the file out, say so
            failures.append(f"{f} ({images_lib.unreadable_reason(f, error)})")
    if failures:
        _console.warn(f"{len(failures)} unreadable image(s) under {path} left out: " + "; ".join(failures))
    if not arrays:
        return None
    size = size or arrays[0].shape[:2]
    arrays = [a if a.shape[:2] == tuple(size) else np.round(images_lib.resize(a, size)) for a in arrays]
    labelled = entries[0][1] is not None
    return Images(np.stack(arrays).astype(np.float32), np.array(labels) if labelled else None, path)


def load_sample(spec, image_size: Tuple[int, int], num_channels: int, limit: Optional[int]) -> Images:
    """`sample(load(spec, ...), limit)`, a folder's files drawn before they are decoded."""
    parts = list(chunks(spec, image_size, num_channels, limit))
    labels = None if parts[0].labels is None else np.concatenate([part.labels for part in parts])
    return Images(np.concatenate([part.images for part in parts]), labels, parts[0].source)


def chunks(spec, image_size: Tuple[int, int], num_channels: int, limit: Optional[int] = None,
           size: int = 256) -> Iterator[Images]:
    """`sample(load(spec, ...), limit)` a chunk of `size` images at a time: a folder is decoded
    chunk by chunk (the memory of one chunk, however many files it holds), its files drawn as
    `sample` draws images."""
    path = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None
    if path is None or path.lower() == "mnist" or not storage.isdir(path):
        data = sample(load(spec, image_size, num_channels), limit)
        for start in range(0, len(data), size):
            yield data.take(start, start + size)
        return
    entries = sampled_entries(path, limit)
    decoded = 0
    for start in range(0, len(entries), size):
        data = _decode_entries(entries[start:start + size], path, image_size, num_channels)
        if data is not None:
            decoded += len(data)
            yield Images(conform(data.images, image_size, num_channels), data.labels, data.source)
    if not decoded:
        raise UserError(f"None of the {len(entries)} images under {path} could be decoded.")


def sampled_entries(path: str, limit: Optional[int] = None) -> list:
    """[(file, class id or None)] of a folder, at most `limit` drawn as `sample` draws images
    (before any is decoded)."""
    entries = _folder_entries(path)
    labels = [label for _, label in entries]
    order = sample_order(None if labels[0] is None else labels, len(entries), limit)
    return entries if order is None else [entries[i] for i in order]


def conform(images, image_size: Tuple[int, int], num_channels: int) -> np.ndarray:
    """(N, H, W[, C]) pixels 0..255 -> float32 (N, height, width, num_channels).

    Channels and size are converted by keras_vit.images (grey repeated, colour
    to ITU-R 601 luma, alpha dropped; bilinear antialiased resize). Values are rounded to
    whole pixels, so the PNG-encoded copy the bytes signature sees is exact.
    """
    try:
        images = np.asarray(images, dtype=np.float32)
    except (ValueError, TypeError) as error:  # ragged lists, strings, objects
        raise UserError(f"Images must be numbers (N, H, W, C): {error}.") from None
    if images.ndim == 2 and images.shape[1] == image_size[0] * image_size[1] * num_channels:
        images = images.reshape(-1, *image_size, num_channels)  # flat rows, as in MNIST CSVs
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise UserError(f"Expected images (N, H, W, C), got shape {images.shape}.")
    if len(images) == 0:
        raise UserError("No images given.")
    if images.max() <= 1.0 and images.min() < 0.0:
        raise UserError("Images look like [-1, 1] floats; exports take pixels 0..255 (preprocessing is inside).")
    try:
        images = images_lib.convert_channels(images, num_channels)
    except UserError:
        raise UserError(f"Images have {images.shape[-1]} channels; the model takes {num_channels}.") from None
    images = images_lib.resize(images, image_size)
    return np.clip(np.round(images), 0, 255).astype(np.float32)


SAMPLE_SEED = 0


def stratified_order(labels, seed: int = SAMPLE_SEED) -> np.ndarray:
    """Indices in a seeded order that goes round the classes: any prefix of it is
    as balanced across classes as the data allows."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    rounds = max(len(members) for members in per_class)
    return np.array([members[r] for r in range(rounds) for members in per_class if r < len(members)], np.int64)


def sample_order(labels, count: int, n: Optional[int], seed: int = SAMPLE_SEED) -> Optional[np.ndarray]:
    """The indices of at most `n` of `count` items, drawn across classes where `labels` are given
    (seeded, stratified), in the items' own order; None: all of them (n is None or enough)."""
    if n is None or n >= count:
        return None
    order = (stratified_order(labels, seed) if labels is not None
             else np.random.default_rng(seed).permutation(count))[:n]
    return np.sort(order)  # keep the data's own order among the chosen


def sample(data: Images, n: Optional[int], seed: int = SAMPLE_SEED) -> Images:
    """At most `n` images, drawn across classes (seeded, stratified); all when n is None or enough."""
    order = sample_order(data.labels, len(data), n, seed)
    if order is None:
        return data
    return Images(data.images[order], None if data.labels is None else data.labels[order], data.source)


def split_calibration(data: Images, n: int, seed: int = SAMPLE_SEED):
    """(calibration, validation, held_out): `n` images drawn across classes to
    calibrate on, the others to validate on. With fewer than 2n images none can
    be spared: calibration is then a sample of the validation images (held_out False)."""
    if len(data) < 2 * n:
        return sample(data, n, seed), data, False
    order = (stratified_order(data.labels, seed) if data.labels is not None
             else np.random.default_rng(seed).permutation(len(data)))
    chosen = np.zeros(len(data), bool)
    chosen[order[:n]] = True

    def part(mask):
        return Images(data.images[mask], None if data.labels is None else data.labels[mask], data.source)

    return part(chosen), part(~chosen), True


def num_classes_in(data: Optional[Images]) -> Optional[int]:
    return None if data is None or data.labels is None else int(len(np.unique(data.labels)))


def describe(data: Images) -> str:
    """"800 images of 10 classes" (or "32 images, unlabelled")."""
    classes = num_classes_in(data)
    return f"{len(data)} images" + (", unlabelled" if classes is None else f" of {classes} classes")


def random_images(n: int, image_size, num_channels: int, seed: int = 0) -> Images:
    """Stand-in validation images when the user gives none (no accuracy then)."""
    rng = np.random.default_rng(seed)
    return Images(rng.integers(0, 256, (n, *image_size, num_channels)).astype(np.float32), None, "random pixels")
