"""Encoded image bytes -> the pixels `keras-vit predict` sees, in TensorFlow ops only.

The SavedModel's `serving_bytes` runs this inside TF Serving, where no Python
(so no Pillow) runs. keras_vit.images.decode's rules are redone here with
TensorFlow's decoders and a few reads of the file's bytes:

* JPEG: libjpeg's accurate integer IDCT (Pillow's; TensorFlow's default,
  INTEGER_FAST, is a few levels off), CMYK in Adobe's convention, as Pillow;
* PNG: 16-bit samples keep their high byte; palettes expanded; alpha dropped;
* GIF: the first frame; BMP: 8-bit palettes applied; WebP: alpha dropped;
* EXIF orientation (JPEG APP1, PNG eXIf, WebP EXIF: IFD0's tag 0x0112) applied;
* then keras_vit.images' channel rule and resize, rounded to whole pixels as
  keras_vit.images.load_image rounds them.

What TensorFlow cannot decode as Pillow does is refused with an
InvalidArgumentError that says why (`REFUSED`), or listed in docs/export.md.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from keras_vit import images as images_lib

# (offset, bytes) that each format's file starts with: the first format that matches is decoded.
_SIGNATURES = (
    ("jpeg", ((0, b"\xff\xd8\xff"),)),
    ("png", ((0, b"\x89PNG\r\n\x1a\n"),)),
    ("gif", ((0, b"GIF8"),)),
    ("bmp", ((0, b"BM"),)),
    ("webp", ((0, b"RIFF"), (8, b"WEBP"))),
)

# Each reason is the text of the request's error (no quotes: TensorFlow escapes them).
REFUSED = {
    "format": "serving_bytes reads JPEG, PNG, GIF, BMP and WebP files; these bytes are none of them "
              "(decode TIFF, PPM/PGM, HEIC and others yourself and send pixels to serving_default)",
    "cmyk": "a CMYK JPEG without the Adobe APP14 marker: TensorFlow would read its inks inverted from "
            "keras-vit predict (Pillow); convert it to RGB first",
    "bmp": "serving_bytes reads uncompressed BMPs of 8, 24 or 32 bits per pixel only "
           "(the BMP decoder of TensorFlow); convert this one to PNG",
    "animated_webp": "an animated WebP: TensorFlow cannot give its first frame alone; "
                     "send its first frame as PNG or JPEG",
}

_ORIENTATION_TAG = 0x0112
# Pillow's exif_transpose for orientations 2..8 as three steps, in this order:
# transpose (swap rows and columns), mirror (reverse columns), flip (reverse rows).
_TRANSPOSED, _MIRRORED, _FLIPPED = (5, 6, 7, 8), (2, 3, 6, 7), (3, 4, 7, 8)
_BGR_MASKS = (0x00FF0000, 0x0000FF00, 0x000000FF)  # a 32-bit BI_BITFIELDS BMP's red, green, blue masks
_SHORT_TYPES, _LONG_TYPES = (3, 8), (4, 9)  # TIFF SHORT/SSHORT, LONG/SLONG: what Pillow reads as an int


def load_image(encoded, size, num_channels):
    """A scalar string of image bytes -> float32 (height, width, num_channels) whole pixels 0..255.

    keras_vit.images.load_image's pixels (decode, resize bilinear and
    antialiased, round), as float32 for the model.
    """
    return resized_pixels(decode(encoded, num_channels), size)


def resized_pixels(image, size):
    """Decoded uint8 (H, W, C) -> load_image's float32 whole pixels at `size`."""
    # At the same size the resize is the identity to float precision; rounding makes it exact.
    pixels = images_lib.resize(image, size)
    return tf.round(tf.clip_by_value(pixels, 0.0, 255.0))


def load_image_naflex(encoded, patch_size, max_patches, num_channels):
    """load_image for a NaFlex model (SigLIP2): the image at its own NaFlex size, the largest
    at its aspect ratio whose grid holds at most `max_patches` patches
    (keras_vit.model.naflex.naflex_size, the same search in float64 ops), as
    keras_vit.model.naflex.naflex_pixels gives `keras-vit predict`."""
    return naflex_pixels(decode(encoded, num_channels), patch_size, max_patches)


def naflex_pixels(image, patch_size, max_patches):
    """Decoded uint8 (H, W, C) -> load_image_naflex's float32 whole pixels."""
    from keras_vit.model.naflex import bisect_size

    shape = tf.cast(tf.shape(image)[:2], tf.float64)
    sides = bisect_size(shape[0], shape[1], patch_size, max_patches, tf.math.ceil, tf.maximum, tf.where,
                        number=lambda value: tf.constant(value, tf.float64))
    size = tf.cast(tf.stack(sides), tf.int32)
    pixels = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear", antialias=True)
    return tf.round(tf.clip_by_value(pixels, 0.0, 255.0))


def decode(encoded, num_channels):
    """A scalar string of image bytes -> uint8 (H, W, num_channels), as keras_vit.images.decode.

    One traced function per channel count, made once per process: a graph that decodes
    (serving_bytes) calls it instead of tracing its few thousand ops again, which took ~3 s each
    time (twice per SavedModel: its signature's trace, then tf.saved_model.save's)."""
    return _traced_decoder(int(num_channels))(encoded)


@functools.lru_cache(maxsize=None)
def _traced_decoder(num_channels):
    # The concrete function: a tf.function called while another graph is built traces again for
    # each outer graph (its cache keys on the calling context); the traced graph itself does not.
    return tf.function(functools.partial(_decode, num_channels=num_channels),
                       input_signature=[tf.TensorSpec((), tf.string)], autograph=False).get_concrete_function()


def _decode(encoded, num_channels):
    data = _as_bytes(encoded)
    decoders = {"jpeg": _jpeg, "png": _png, "gif": _gif, "bmp": _bmp, "webp": _webp}
    branches = [decoders[name] for name, _ in _SIGNATURES] + [_unknown]
    found = [_starts_with_all(data, parts) for _, parts in _SIGNATURES] + [tf.constant(True)]
    kind = tf.argmax(tf.cast(tf.stack(found), tf.int32), output_type=tf.int32)  # the first that matches
    image = tf.switch_case(kind, [lambda f=f: f(encoded, data) for f in branches])
    return images_lib.convert_channels(tf.ensure_shape(image, (None, None, 3)), num_channels)


# --- one decoder per format: uint8 (H, W, 3) -----------------------------------------

def _jpeg(encoded, data):
    exif_at, adobe = _walk(data, 2, _jpeg_segment, header=4)  # marker, length
    components = tf.io.extract_jpeg_shape(encoded)[2]
    with tf.control_dependencies([_refuse_unless((components != 4) | adobe, "cmyk")]):
        # Pillow's libjpeg uses the accurate integer IDCT; this gives its pixels exactly.
        image = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE")
    return _orient(image, _orientation(data, exif_at))


def _png(encoded, data):
    exif_at, _ = _walk(data, 8, _png_chunk, header=8)  # length, type
    sixteen = tf.io.decode_png(encoded, channels=3, dtype=tf.uint16)  # 8-bit samples come as x * 257
    image = tf.cast(tf.bitwise.right_shift(sixteen, 8), tf.uint8)  # the high byte, as keras_vit.images
    return _orient(image, _orientation(data, exif_at))


def _gif(encoded, data):
    return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def _bmp(encoded, data):
    bits = _uint(data, 28, 2, little=True)
    with tf.control_dependencies([_refuse_unless(_bmp_readable(data, bits), "bmp")]):
        image = tf.io.decode_bmp(encoded, channels=3)  # an 8-bit BMP gives its palette indices
    return tf.cond(bits == 8, lambda: tf.gather(_bmp_palette(data), tf.cast(image[..., 0], tf.int32)),
                   lambda: image)


def _bmp_readable(data, bits):
    """Whether TensorFlow's BMP decoder reads this BMP right: it takes the pixels
    as plain BGR(A) rows (or palette indices) whatever the header says."""
    compression = _uint(data, 30, 4, little=True)
    masks = _uint(data, 54 + 4 * tf.range(3), 4, little=True)  # BI_BITFIELDS' red, green, blue masks
    standard_masks = tf.reduce_all(masks == tf.constant(_BGR_MASKS, tf.int64))
    return (_is_in(bits, (8, 24, 32)) & (compression == 0)) | ((bits == 32) & (compression == 3) & standard_masks)


def _webp(encoded, data):
    extended = _starts_with(data, 12, b"VP8X")
    animated = extended & (tf.bitwise.bitwise_and(_uint(data, 20, 1), 0x02) != 0)
    # Refused before decoding: asked for one frame of an animated WebP with
    # channels=0, TensorFlow's decoder writes past its output (the server aborts).
    with tf.control_dependencies([_refuse_unless(~animated, "animated_webp")]):
        image = tf.io.decode_image(encoded, channels=0, expand_animations=False)[..., :3]  # RGB or RGBA
    exif_at, _ = _walk(data, 12, _webp_chunk, header=8)  # type, length
    return _orient(image, _orientation(data, exif_at))


def _unknown(encoded, data):
    with tf.control_dependencies([_refuse_unless(tf.constant(False), "format")]):
        return tf.zeros((0, 0, 3), tf.uint8)


def _refuse_unless(condition, reason):
    return tf.debugging.Assert(condition, [tf.constant(REFUSED[reason])])


def _bmp_palette(data):
    """(256, 3) uint8 RGB colours of an 8-bit BMP's palette (BGRx entries after the info header)."""
    start = 14 + _uint(data, 14, 4, little=True)
    used = _uint(data, 46, 4, little=True)
    used = tf.where(used == 0, tf.constant(256, tf.int64), used)
    index = tf.range(256, dtype=tf.int64)
    colours = _read(data, start + 4 * index, 3)[:, ::-1]  # BGR -> RGB
    return tf.cast(tf.where(index[:, None] < used, colours, 0), tf.uint8)


# --- EXIF orientation ---------------------------------------------------------------

def _orient(image, orientation):
    image = tf.cond(_is_in(orientation, _TRANSPOSED), lambda: tf.transpose(image, (1, 0, 2)), lambda: image)
    image = tf.cond(_is_in(orientation, _MIRRORED), lambda: tf.reverse(image, [1]), lambda: image)
    return tf.cond(_is_in(orientation, _FLIPPED), lambda: tf.reverse(image, [0]), lambda: image)


def _orientation(data, exif_at):
    """The EXIF orientation in the EXIF block at `exif_at` (-1: none): 1 where absent or unreadable."""
    return tf.cond(exif_at >= 0, lambda: _ifd0_orientation(data, _skip_exif_headers(data, exif_at)),
                   lambda: tf.constant(1, tf.int64))


def _skip_exif_headers(data, at):
    # Pillow's Exif.load strips up to two "Exif\0\0" before the TIFF header.
    for _ in range(2):
        at = tf.where(_starts_with(data, at, b"Exif\0\0"), at + 6, at)
    return at


def _ifd0_orientation(data, tiff):
    """Tag 0x0112 of IFD0 in the TIFF structure at `tiff`: its last entry of one
    SHORT or LONG (as Pillow reads it), else 1. Offsets are from `tiff`."""
    little = _starts_with(data, tiff, b"II")
    readable = little | _starts_with(data, tiff, b"MM")
    ifd = tiff + _uint(data, tiff + 4, 4, little)
    entries = ifd + 2 + 12 * tf.range(_uint(data, ifd, 2, little))  # tag, type, count, value: 2 + 2 + 4 + 4 bytes
    tags, types = _uint(data, entries, 2, little), _uint(data, entries + 2, 2, little)
    values = tf.where(_is_in(types, _SHORT_TYPES), _uint(data, entries + 8, 2, little),
                      _uint(data, entries + 8, 4, little))
    found = ((tags == _ORIENTATION_TAG) & _is_in(types, _SHORT_TYPES + _LONG_TYPES)
             & (_uint(data, entries + 4, 4, little) == 1))
    values = tf.concat([[1], tf.boolean_mask(values, found)], 0)  # a later entry overrides, as in Pillow
    return tf.where(readable, values[-1], tf.constant(1, tf.int64))


# --- walking a file's segments to its EXIF block --------------------------------------

def _walk(data, start, step, header):
    """(offset of the first EXIF block or -1, whether an Adobe segment was met),
    stepping `step` from `start` until it says stop or the data ends. A
    segment's (chunk's) content starts `header` bytes after it."""
    end = tf.size(data, out_type=tf.int64) - 1

    def body(position, exif_at, adobe, _):
        following, exif, is_adobe, stop = step(data, position)
        exif_at = tf.where((exif_at < 0) & exif, position + header, exif_at)
        return tf.maximum(following, position + 1), exif_at, adobe | is_adobe, stop  # always forward

    def going(position, _, __, stop):
        return ~stop & (position < end)

    state = (tf.constant(start, tf.int64), tf.constant(-1, tf.int64), tf.constant(False), tf.constant(False))
    _, exif_at, adobe, _ = tf.while_loop(going, body, state)
    return exif_at, adobe


def _jpeg_segment(data, position):
    """A JPEG marker as Pillow walks them: junk and fill bytes skipped one by
    one, markers without a length stepped over, up to the scan (SOS) or the end (EOI)."""
    first, marker = _uint(data, position, 1), _uint(data, position + 1, 1)
    is_marker = (first == 0xFF) & (marker != 0xFF)
    bare = _is_in(marker, (0x00, 0x01)) | ((marker >= 0xD0) & (marker <= 0xD8))  # no length field
    following = tf.where(~is_marker, position + 1,
                         tf.where(bare, position + 2, position + 2 + _uint(data, position + 2, 2)))
    exif = is_marker & (marker == 0xE1) & _starts_with(data, position + 4, b"Exif\0\0")
    adobe = is_marker & (marker == 0xEE) & _starts_with(data, position + 4, b"Adobe")
    return following, exif, adobe, is_marker & _is_in(marker, (0xDA, 0xD9))


def _png_chunk(data, position):
    """A PNG chunk: length (big-endian), type, data, CRC; up to IEND."""
    following = position + 12 + _uint(data, position, 4)
    return (following, _starts_with(data, position + 4, b"eXIf"), tf.constant(False),
            _starts_with(data, position + 4, b"IEND"))


def _webp_chunk(data, position):
    """A RIFF chunk of a WebP file: type, length (little-endian), data padded to even."""
    length = _uint(data, position + 4, 4, little=True)
    following = position + 8 + length + tf.bitwise.bitwise_and(length, 1)
    return following, _starts_with(data, position, b"EXIF"), tf.constant(False), tf.constant(False)


# --- reading bytes ----------------------------------------------------------------------

def _as_bytes(encoded):
    """A string's bytes as a uint8 vector with one 0 after them: reads past the end give 0."""
    return tf.concat([tf.io.decode_raw(encoded, tf.uint8), tf.zeros((1,), tf.uint8)], 0)


def _read(data, positions, n):
    """int64 (..., n): the n bytes from each position (0 past the end)."""
    last = tf.size(data, out_type=tf.int64) - 1
    index = tf.clip_by_value(tf.cast(positions, tf.int64)[..., None] + tf.range(n, dtype=tf.int64), 0, last)
    return tf.cast(tf.gather(data, index), tf.int64)


def _uint(data, positions, n, little=False):
    """The n-byte unsigned integers at `positions`, big- or little-endian (`little` may be a tensor)."""
    significance = tf.range(n, dtype=tf.int64)
    shifts = 8 * tf.where(little, significance, n - 1 - significance)
    return tf.reduce_sum(tf.bitwise.left_shift(_read(data, positions, n), shifts), -1)


def _starts_with(data, position, expected: bytes):
    return tf.reduce_all(_read(data, position, len(expected)) == tf.constant(list(expected), tf.int64))


def _starts_with_all(data, parts):
    return tf.reduce_all(tf.stack([_starts_with(data, offset, expected) for offset, expected in parts]))


def _is_in(x, values):
    return tf.reduce_any(tf.equal(x[..., None], tf.constant(values, x.dtype)), -1)
