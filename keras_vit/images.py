"""Images in, model inputs out: the one place that knows image files and pixels.

Training (`folder:`, `list:`, TFRecords, tfds), `keras-vit predict`,
`keras-vit inspect` and export validation all go through these functions, so
they all see the same pixels for the same file:

* `IMAGE_EXTENSIONS`, `is_image_file`, `list_images`, `find_images`, `class_folders`: which
  files are images (by extension, case-insensitive; hidden files never) and which
  sub-folders are classes (sorted names are the class ids).
* `decode`: a file or encoded bytes -> uint8 pixels (H, W, C), with Pillow.
  The rules, in order:
    - the first frame of an animation (GIF, WebP, TIFF pages);
    - EXIF orientation applied;
    - 16-bit samples (modes I;16, I;16B, I;16L, I, and 16-bit RGB PNGs) keep
      their high byte (x >> 8), as libpng and TensorFlow's decode_png do, so a
      16-bit copy of an 8-bit picture (x * 257) decodes to the same pixels;
      32-bit float (mode F) is taken as 0..1 when its maximum is at most 1,
      else as 0..255 (clipped);
    - alpha is dropped (the colour channels are kept as stored, not
      composited), as tf.io.decode_image(channels=3) does;
    - palette, CMYK, YCbCr, LAB, HSV and 1-bit images become RGB or L.
* `convert_channels`: 1 <-> 3 channels with ONE grayscale rule, ITU-R 601
  luma exactly as PIL's convert("L"): (19595 R + 38470 G + 7471 B) / 65536,
  rounded for integer pixels. Works on numpy arrays and TF tensors.
* `resize`: bilinear, antialiased (TF), the identity at the same size.
* `to_model_range`: pixels 0..255 -> [-1, 1] (keras_vit.preprocess_input);
  `takes_raw_pixels(model)`: whether a model takes 0..255 or [-1, 1], as
  the model records it (ViT.input_range); `model_inputs`: pixels -> what
  `model(...)` takes.
* `find_unopenable`: the cheap check before training: each file's header,
  in parallel (pixels are decoded, and damage past the header found, in training).

Folders and files may be on any filesystem keras_vit.utils.storage reaches (gs://,
ram://), except in `find_images`, which takes local paths.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from keras_vit.utils import storage
from keras_vit.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")

# ITU-R 601 luma in PIL's fixed point (PIL's convert("L")): weights / 65536.
_LUMA_FIXED = (19595, 38470, 7471)
_LUMA = np.array(_LUMA_FIXED, dtype=np.float64) / 65536.0

_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


# --- which files are images ------------------------------------------------------

def is_image_file(path) -> bool:
    """True for a file name with an image extension that is not hidden (".name")."""
    name = storage.basename(path)
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def list_images(directory):
    """The image files directly inside `directory`, sorted; others ignored silently."""
    return sorted(storage.join(directory, name) for name in storage.listdir(directory)
                  if is_image_file(name) and storage.isfile(storage.join(directory, name)))


def class_folders(directory):
    """The class folders of a folder of images: its non-hidden sub-folders, sorted; a class's
    id is its place in this list. The one rule of training's folder: source and export's."""
    return sorted(name for name in storage.listdir(directory)
                  if not name.startswith(".") and storage.isdir(storage.join(directory, name)))


def find_images(paths, recursive=False):
    """Expands folders into the image files inside them (sorted).

    Files named explicitly are kept whatever their extension (a bad one is
    reported when it is read); inside a folder only non-hidden files with an
    image extension are taken. Paths that do not exist are kept, so that the
    caller reports them by name.
    """
    found = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            found.extend(str(p) for p in sorted(path.glob(pattern))
                         if p.is_file() and is_image_file(p)
                         and not any(part.startswith(".") for part in p.relative_to(path).parts))
        else:
            found.append(str(path))
    return found


# --- decoding ---------------------------------------------------------------------

def decode(source, num_channels=None) -> np.ndarray:
    """A file path or encoded bytes -> uint8 pixels (H, W, C).

    C is `num_channels` (1 or 3) when given, else the image's own (1 for
    grayscale, 3 for colour). Raises OSError / ValueError (Pillow's) for a
    file that is missing, not an image, or truncated.
    """
    from PIL import Image, ImageOps

    if storage.is_remote(source):
        source = storage.read_bytes(source)  # Pillow reads local files only
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    with Image.open(source) as image:
        image.load()  # decode now (the first frame): a truncated file fails here, not later
        image = ImageOps.exif_transpose(image)
        pixels = _eight_bit(image)
    return pixels if num_channels is None else convert_channels(pixels, num_channels)


def _eight_bit(image) -> np.ndarray:
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES:
        values = np.asarray(image).astype(np.int64)
        return (np.clip(values, 0, 65535) >> 8).astype(np.uint8)[..., None]
    if mode == "F":
        values = np.asarray(image, dtype=np.float64)
        scale = 255.0 if values.size and np.nanmax(values) <= 1.0 else 1.0
        return np.clip(np.round(np.nan_to_num(values) * scale), 0, 255).astype(np.uint8)[..., None]
    if mode in ("L", "1", "LA", "La"):
        return np.asarray(image.convert("L") if mode != "L" else image, dtype=np.uint8)[..., None]
    if mode != "RGB":
        # P/PA (palette), RGBA/RGBX/RGBa (alpha dropped), CMYK, YCbCr, LAB, HSV.
        image = image.convert("RGB")
    return np.asarray(image, dtype=np.uint8)


def convert_channels(pixels, num_channels):
    """(..., C) pixels -> (..., num_channels): alpha dropped, grey repeated, colour to luma.

    Integer pixels stay integers (luma rounded as PIL's "L"); float pixels
    stay float. numpy in, numpy out; a TF tensor in, a TF tensor out.
    """
    if _is_tensor(pixels):
        return _convert_channels_tf(pixels, num_channels)
    x = np.asarray(pixels)
    channels = x.shape[-1]
    if channels in (2, 4):  # LA / RGBA: alpha dropped
        x, channels = x[..., :channels - 1], channels - 1
    if channels == num_channels:
        return x
    if channels == 1 and num_channels == 3:
        return np.repeat(x, 3, axis=-1)
    if channels == 3 and num_channels == 1:
        if np.issubdtype(x.dtype, np.integer):
            weighted = x.astype(np.int64) @ np.array(_LUMA_FIXED, np.int64)
            return ((weighted + 32768) >> 16).astype(x.dtype)[..., None]
        return (x.astype(np.float64) @ _LUMA).astype(x.dtype)[..., None]
    raise UserError(f"Cannot convert {channels}-channel images for a {num_channels}-channel model.")


def _convert_channels_tf(image, num_channels):
    import tensorflow as tf

    channels = image.shape[-1]
    if channels is None:
        raise UserError("The number of channels must be known.")
    if channels in (2, 4):
        image, channels = image[..., :channels - 1], channels - 1
    if channels == num_channels:
        return image
    if channels == 1 and num_channels == 3:
        return tf.concat([image] * 3, axis=-1)
    if channels == 3 and num_channels == 1:
        if image.dtype.is_integer:
            weighted = tf.tensordot(tf.cast(image, tf.int64), tf.constant(_LUMA_FIXED, tf.int64), axes=1)
            return tf.cast(tf.bitwise.right_shift(weighted + 32768, 16), image.dtype)[..., None]
        luma = tf.tensordot(tf.cast(image, tf.float64), tf.constant(_LUMA, tf.float64), axes=1)
        return tf.cast(luma, image.dtype)[..., None]
    raise UserError(f"Cannot convert {channels}-channel images for a {num_channels}-channel model.")


def _is_tensor(x):
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover - TF is a dependency
        return False
    return tf.is_tensor(x)


def resize(pixels, size):
    """(H, W, C) or (B, H, W, C) pixels -> float32 at `size` (height, width).

    Bilinear and antialiased (as the SavedModel's bytes signature); exactly the
    identity when the size already matches. numpy in, numpy out.
    """
    import tensorflow as tf

    size = tuple(int(s) for s in size)
    tensor = _is_tensor(pixels)
    x = tf.cast(pixels, tf.float32)
    if tuple(x.shape[-3:-1]) != size:
        x = tf.image.resize(x, size, method="bilinear", antialias=True)
    return x if tensor else x.numpy()


def to_model_range(pixels):
    """Pixels 0..255 -> [-1, 1], the ViT's input range (works on numpy, TF and Keras tensors)."""
    return pixels / 127.5 - 1.0


# ViTConfig.pixel_normalization -> (mean, std) per RGB channel, in pixels 0..255: what each
# family's image processor does after rescaling by 1/255 (transformers' constants).
NORMALIZATIONS = {
    "minus_one_to_one": ((127.5, 127.5, 127.5), (127.5, 127.5, 127.5)),  # the paper's, SigLIP's
    "imagenet": (tuple(255 * m for m in (0.485, 0.456, 0.406)), tuple(255 * s for s in (0.229, 0.224, 0.225))),
    "clip": (tuple(255 * m for m in (0.48145466, 0.4578275, 0.40821073)),
             tuple(255 * s for s in (0.26862954, 0.26130258, 0.27577711))),
}


def normalize(pixels, normalization="minus_one_to_one"):
    """Pixels 0..255 (..., C) -> what weights of `normalization` expect
    (ViTConfig.pixel_normalization); numpy, TF and Keras tensors alike."""
    if normalization == "minus_one_to_one":
        return to_model_range(pixels)  # the same arithmetic for any channel count
    mean, std = NORMALIZATIONS[normalization]
    channels = pixels.shape[-1]
    if channels is not None and int(channels) != len(mean):
        raise UserError(f"The {normalization} normalisation has a mean and std per RGB channel; these images have "
                        f"{channels} channels: convert them to RGB (keras_vit.images.convert_channels).")
    return (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def pixel_normalization(model) -> str:
    """The normalisation `model` takes after pixels are scaled (its config's; [-1, 1] for other models)."""
    config = getattr(model, "config", None)
    return getattr(config, "pixel_normalization", "minus_one_to_one")


# --- model-shaped pixels ------------------------------------------------------------

def to_model_pixels(images, image_size, num_channels):
    """Pixels (B, H, W[, C]) in 0..255 -> float32 (B, height, width, num_channels) in 0..255."""
    x = np.asarray(images)
    if x.ndim == 3:  # (B, H, W) grayscale
        x = x[..., None]
    if x.ndim != 4:
        raise UserError(f"Expected images (B, H, W, C) or (B, H, W), got shape {x.shape}.")
    x = convert_channels(x, num_channels)
    x = resize(x, image_size) if len(x) else x.reshape(0, *image_size, num_channels)
    return np.clip(np.asarray(x, np.float32), 0.0, 255.0)


def takes_raw_pixels(model) -> bool:
    """True when `model` takes pixels 0..255 (it scales them itself), False
    when it takes [-1, 1]. The model says so (ViT.takes_raw_pixels, from
    include_preprocessing); other models are asked for include_preprocessing."""
    says = getattr(model, "takes_raw_pixels", None)
    if isinstance(says, bool):
        return says
    return bool(getattr(model, "include_preprocessing", False))


def model_inputs(model, images):
    """Pixels in 0..255 -> exactly what `model(...)` takes.

    Resized and channel-converted for the model (a model that takes any size,
    ViT(dynamic_image_size=True), keeps the images' size); scaled to [-1, 1]
    unless the model takes pixels itself (`takes_raw_pixels`).
    """
    size = tuple(np.shape(images)[1:3]) if getattr(model, "dynamic_image_size", False) else model.image_size
    x = to_model_pixels(images, size, model.num_channels)
    return x if takes_raw_pixels(model) else normalize(x, pixel_normalization(model))


def load_image(path, image_size, num_channels=3):
    """Reads one image file as uint8 pixels (H, W, num_channels) at `image_size`.

    `decode`, then `fit_pixels`. Raises OSError or ValueError for a missing,
    unreadable or truncated file.
    """
    if num_channels not in (1, 3):
        raise UserError(f"Cannot read image files for a model with {num_channels} channels.")
    return fit_pixels(decode(path, num_channels), image_size, num_channels)


def fit_pixels(pixels, image_size, num_channels):
    """Decoded pixels (H, W[, C]) -> uint8 (h, w, num_channels) at `image_size`: resized (no
    cropping) and rounded to whole pixels. `image_size` is (h, w), or a function of the
    image's (H, W) giving it (each image at its own size: keras_vit.model.naflex.size_rule)."""
    size = image_size(*np.shape(pixels)[:2]) if callable(image_size) else image_size
    return np.round(to_model_pixels(np.asarray(pixels)[None], size, num_channels)[0]).astype(np.uint8)


def load_images(paths, image_size, num_channels=3):
    """Reads several files; returns (pixels (B, H, W, C) uint8, paths read, failures).

    `failures` is a list of (path, reason) for files that could not be read;
    they are skipped, not raised. With `image_size` a function (each image at
    its own size, `fit_pixels`) the pixels are a list of arrays.
    """
    images, read, failures = [], [], []
    for path in paths:
        try:
            images.append(load_image(path, image_size, num_channels))
            read.append(path)
        except Exception as error:  # noqa: BLE001 - any decoder error means "skip this file"
            failures.append((str(path), unreadable_reason(path, error)))
    if callable(image_size):
        return images, read, failures
    pixels = np.stack(images) if images else np.zeros((0, *image_size, num_channels), np.uint8)
    return pixels, read, failures


def unreadable_reason(path, error):
    if not storage.exists(path):
        return "no such file"
    if storage.isdir(path):
        return "is a folder"
    if storage.getsize(path) == 0:
        return "empty file"
    if type(error).__name__ == "UnidentifiedImageError":  # Pillow's word for "no image format it knows"
        return "not an image (Pillow recognises no image format in it)"
    return f"{type(error).__name__}: {error}"


# --- the cheap check before training -----------------------------------------------------

def _open_problem(path):
    """None when `path` opens as an image (its header parses), else why not.
    Pillow reads the header only: no pixel is decoded."""
    from PIL import Image

    try:
        with storage.open(path, "rb") as f, Image.open(f) as image:
            if image.width < 1 or image.height < 1:
                return "no pixels"
        return None
    except Exception as error:  # noqa: BLE001 - every reader error makes the file unreadable
        return unreadable_reason(path, error)


def find_unopenable(paths, description="Checking image headers", workers=None, progress=True):
    """[(path, reason)] for the files whose header does not parse (missing,
    empty, not an image, a corrupt header), in parallel with a progress bar.
    A file whose pixels are damaged past its header passes: it is found when
    it is decoded."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [os.fspath(p) for p in paths]
    with ThreadPoolExecutor(workers or min(16, 4 * (os.cpu_count() or 1))) as pool:  # file I/O bound
        outcomes = pool.map(_open_problem, paths, chunksize=64)
        if progress:
            from tqdm import tqdm

            outcomes = tqdm(outcomes, total=len(paths), desc=description, unit="file", leave=False)
        return [(path, reason) for path, reason in zip(paths, outcomes) if reason is not None]
