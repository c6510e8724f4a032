"""Image files of every odd and broken kind, written by Pillow from one picture."""

import io
import os

import numpy as np
from PIL import Image


def picture(height=20, width=24, seed=0):
    """A smooth RGB uint8 picture (gradients plus noise: resizing and rounding matter)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) * 5 % 256], -1)
    return np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)


def png16_gray(pixels8):
    """The 8-bit grayscale picture as a 16-bit PNG (each sample x * 257, as image tools widen)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels8.astype(np.uint16) * 257).save(buffer, "PNG")
    return buffer.getvalue()


def png16_rgb(pixels8):
    """The 8-bit RGB picture as a 48-bit PNG (TF writes 16-bit RGB PNGs; Pillow does not)."""
    import tensorflow as tf

    return tf.io.encode_png(tf.constant(pixels8.astype(np.uint16) * 257)).numpy()


def encoded(pixels, fmt, mode=None, **options):
    image = Image.fromarray(pixels)
    if mode:
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def write_odd_and_broken(folder, seed=0):
    """Writes one file of each kind into `folder`; returns ({name: kind}, broken names, ignored names)."""
    os.makedirs(folder, exist_ok=True)
    rgb = picture(seed=seed)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    files = {
        "cmyk.jpg": encoded(rgb, "JPEG", "CMYK", quality=95),
        "progressive.jpg": encoded(rgb, "JPEG", progressive=True, quality=95),
        "UPPER.JPG": encoded(rgb, "JPEG", quality=95),
        "sixteen.png": png16_gray(gray),
        "sixteen_rgb.png": png16_rgb(rgb),
        "palette.png": encoded(rgb, "PNG", "P"),
        "rgba.png": encoded(np.dstack([rgb, np.full(rgb.shape[:2], 128, np.uint8)]), "PNG"),
        "gray.png": encoded(gray, "PNG"),
        "first.gif": encoded(rgb, "GIF"),
        "photo.webp": encoded(rgb, "WEBP", lossless=True),
        "scan.tiff": encoded(rgb, "TIFF"),
        "small.bmp": encoded(rgb[:7, :9], "BMP"),
    }
    broken = {
        "truncated.jpg": encoded(rgb, "JPEG")[:300],
        "zero.png": b"",
        "bad_header.png": b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDX" + os.urandom(64),
    }
    ignored = {".hidden.png": encoded(rgb, "PNG"), "notes.txt": b"not an image\n"}
    for name, content in {**files, **broken, **ignored}.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(content)
    return sorted(files), sorted(broken), sorted(ignored)
