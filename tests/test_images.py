"""keras_vit.images: which files are images, how they decode (16-bit, palette,
CMYK, alpha, EXIF, animation), the one grayscale rule, resizing and scaling,
checked against Pillow and TensorFlow's own decoders."""

import io
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from keras_vit import images
from tests import image_files


def test_one_extension_list_case_insensitive_and_hidden_files_ignored(tmp_path):
    for name in ("a.PNG", "b.Jpeg", "c.webp", "d.TIFF", "e.pgm", ".hidden.png", "notes.txt", "f.gif"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub.png").mkdir()
    assert [os.path.basename(p) for p in images.list_images(str(tmp_path))] == [
        "a.PNG", "b.Jpeg", "c.webp", "d.TIFF", "e.pgm", "f.gif"]
    assert [os.path.basename(p) for p in images.find_images([tmp_path])] == [
        "a.PNG", "b.Jpeg", "c.webp", "d.TIFF", "e.pgm", "f.gif"]
    # A file named explicitly is kept whatever its name (it is reported when read).
    assert images.find_images([tmp_path / "notes.txt"]) == [str(tmp_path / "notes.txt")]


def test_a_16_bit_png_decodes_to_the_8_bit_pixels_where_convert_L_saturates():
    gray = np.asarray(Image.fromarray(image_files.picture()).convert("L"))
    eight = image_files.encoded(gray, "PNG")
    sixteen = image_files.png16_gray(gray)
    assert Image.open(io.BytesIO(sixteen)).mode.startswith("I")
    # The defect: Pillow's convert("L") clips 16-bit samples to 255.
    assert (np.asarray(Image.open(io.BytesIO(sixteen)).convert("L")) == 255).mean() > 0.9
    for channels in (1, 3):
        np.testing.assert_array_equal(images.decode(sixteen, channels), images.decode(eight, channels))
    # TensorFlow's PNG decoder keeps the high byte too.
    np.testing.assert_array_equal(images.decode(sixteen, 1), tf.io.decode_png(sixteen, channels=1).numpy())


def test_a_48_bit_rgb_png_decodes_to_the_8_bit_pixels():
    rgb = image_files.picture()
    np.testing.assert_array_equal(images.decode(image_files.png16_rgb(rgb)), rgb)
    np.testing.assert_array_equal(images.decode(image_files.png16_rgb(rgb), 1),
                                  np.asarray(Image.fromarray(rgb).convert("L"))[..., None])


def test_the_one_grayscale_rule_is_pils_convert_L_on_numpy_and_tf():
    rgb = np.random.default_rng(0).integers(0, 256, (64, 64, 3)).astype(np.uint8)
    pil = np.asarray(Image.fromarray(rgb).convert("L"))[..., None]
    np.testing.assert_array_equal(images.convert_channels(rgb, 1), pil)
    np.testing.assert_array_equal(images.convert_channels(tf.constant(rgb), 1).numpy(), pil)
    np.testing.assert_array_equal(images.decode(image_files.encoded(rgb, "PNG"), 1), pil)
    # Float pixels: the same weights (ITU-R 601), unrounded.
    as_float = images.convert_channels(rgb.astype(np.float32), 1)
    assert np.abs(as_float - pil).max() <= 0.5 + 1e-3
    # Grey -> RGB repeats; alpha is dropped.
    np.testing.assert_array_equal(images.convert_channels(pil, 3), np.repeat(pil, 3, -1))
    rgba = np.dstack([rgb, np.zeros(rgb.shape[:2], np.uint8)])
    np.testing.assert_array_equal(images.convert_channels(rgba, 3), rgb)


def test_palette_cmyk_alpha_gif_webp_tiff_and_progressive_jpeg_agree_with_pillow():
    rgb = image_files.picture()
    rgba = np.dstack([rgb, np.arange(rgb.size // 3).reshape(rgb.shape[:2]).astype(np.uint8)])
    cases = {
        "palette": image_files.encoded(rgb, "PNG", "P"),
        "rgba": image_files.encoded(rgba, "PNG"),
        "webp": image_files.encoded(rgb, "WEBP", lossless=True),
        "tiff": image_files.encoded(rgb, "TIFF"),
        "gif": image_files.encoded(rgb, "GIF"),
        "cmyk": image_files.encoded(rgb, "JPEG", "CMYK", quality=95),
        "progressive": image_files.encoded(rgb, "JPEG", progressive=True, quality=95),
    }
    for kind, data in cases.items():
        expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        np.testing.assert_array_equal(images.decode(data, 3), expected, err_msg=kind)
    np.testing.assert_array_equal(images.decode(cases["rgba"], 3), rgb)  # alpha dropped, colours as stored
    np.testing.assert_array_equal(images.decode(cases["webp"], 3), rgb)  # lossless
    np.testing.assert_array_equal(images.decode(cases["tiff"], 3), rgb)
    # The progressive JPEG is the picture its baseline twin is, as TensorFlow's decoder sees it too.
    baseline = images.decode(image_files.encoded(rgb, "JPEG", quality=95), 3)
    assert np.abs(images.decode(cases["progressive"], 3).astype(int) - baseline).mean() < 1
    # (libjpeg builds differ by a few levels in IDCT and upsampling, so: close, not equal.)
    assert np.abs(images.decode(cases["progressive"], 3).astype(int)
                  - tf.io.decode_jpeg(cases["progressive"], channels=3).numpy()).mean() < 2


def test_an_animated_gif_gives_its_first_frame():
    first, second = np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 255, np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(first).save(buffer, "GIF", save_all=True, append_images=[Image.fromarray(second)])
    np.testing.assert_array_equal(images.decode(buffer.getvalue(), 3), first)


def test_exif_orientation_is_applied():
    rgb = image_files.picture(12, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "PNG", exif=exif)
    decoded = images.decode(buffer.getvalue(), 3)
    assert decoded.shape == (20, 12, 3)
    np.testing.assert_array_equal(decoded, np.rot90(rgb, k=-1))


def test_broken_files_raise_and_the_header_check_finds_them_without_decoding(tmp_path, monkeypatch):
    good, broken, ignored = image_files.write_odd_and_broken(tmp_path)
    for name in broken:
        with pytest.raises((OSError, ValueError)):
            images.decode(str(tmp_path / name))
    for name in good:
        assert images.decode(str(tmp_path / name), 3).ndim == 3, name
    files = images.list_images(str(tmp_path))
    assert sorted(os.path.basename(f) for f in files) == sorted(good + broken)
    monkeypatch.setattr(images, "decode", None)  # the check reads headers, never pixels
    found = images.find_unopenable(files + [str(tmp_path / "missing.png")], progress=False)
    assert sorted(os.path.basename(p) for p, _ in found) == sorted(broken + ["missing.png"])
    reasons = dict((os.path.basename(p), r) for p, r in found)
    assert reasons["zero.png"] == "empty file" and reasons["missing.png"] == "no such file"


def test_resize_scale_and_preprocess_input_are_one_rule():
    pixels = np.random.default_rng(0).integers(0, 256, (2, 9, 7, 3)).astype(np.float32)
    np.testing.assert_array_equal(images.resize(pixels, (9, 7)), pixels)  # identity at the same size
    expected = tf.image.resize(pixels, (4, 5), antialias=True).numpy()
    np.testing.assert_allclose(images.resize(pixels, (4, 5)), expected, atol=1e-5)
    np.testing.assert_allclose(images.to_model_range(pixels), pixels / 127.5 - 1, atol=1e-6)
    np.testing.assert_allclose(np.asarray(keras_vit.preprocess_input(pixels)), images.to_model_range(pixels),
                               atol=1e-6)
    assert images.to_model_range(np.array([0.0, 255.0])).tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.slow
def test_saved_model_serving_bytes_decodes_as_keras_vit_images(tmp_path, channels):
    from keras_vit.export import saved_model

    keras_vit_model = keras_vit.ViT(
        keras_vit.ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1),
        image_size=(20, 24), num_classes=5, num_channels=channels)
    head = keras_vit_model.head.kernel
    head.assign(np.random.default_rng(0).normal(size=head.shape).astype("float32"))
    saved_model.write(keras_vit_model, [str(i) for i in range(5)], str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    rgb = image_files.picture()
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 24x20, shown 20x24
    payloads = [image_files.encoded(rgb, "PNG"), image_files.png16_rgb(rgb), image_files.png16_gray(gray),
                image_files.encoded(gray, "PNG"), image_files.encoded(np.dstack([rgb, rgb[..., 0]]), "PNG"),
                image_files.encoded(np.rot90(rgb), "JPEG", quality=90, exif=exif),
                image_files.encoded(gray, "JPEG", quality=90), image_files.encoded(rgb, "PNG", "P")]
    by_bytes = loaded.signatures["serving_bytes"](image_bytes=tf.constant(payloads))["probabilities"].numpy()
    pixels = np.stack([images.load_image(p, (20, 24), channels) for p in payloads]).astype(np.float32)
    by_pixels = loaded.signatures["serving_default"](images=tf.constant(pixels))["probabilities"].numpy()
    np.testing.assert_allclose(by_bytes, by_pixels, atol=1e-6)
    if channels == 1:  # the colour picture and its grey version are the same input to a grey model
        np.testing.assert_allclose(by_bytes[0], by_bytes[3], atol=1e-6)
