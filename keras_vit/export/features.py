"""Dense-feature artifacts: a ViT's chosen blocks as feature maps (keras_vit.feature_model),
as a SavedModel and a float TFLite file, each checked against Keras on the same pixels.

Like every artifact here they take pixels 0..255 (NHWC float32) and normalise
inside, by the model's own rule (ViTConfig.pixel_normalization); they return
one output per block, "block_<i>": (B, rows, cols, D) maps (or (B, N, D)
tokens with output_format="NLC"). A detection or segmentation head built on
the feature model exports the same way (it is a Keras model).
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np

from keras_vit.utils import storage
from keras_vit.errors import UserError

FORMATS = ("saved_model", "tflite")
# Float32 everywhere: an artifact's features must equal Keras' to rounding.
MAX_DIFFERENCE = 1e-4


def export_features(model, out, indices=None, output_format="NHWC", norm=False, formats=FORMATS,
                    images=None) -> Dict[str, dict]:
    """Writes `out`/features_saved_model and `out`/features.tflite and checks them.

    Args:
        model: a keras_vit.ViT.
        indices, output_format, norm: the blocks and form, as keras_vit.feature_model.
        formats: a subset of ("saved_model", "tflite").
        images: pixels 0..255 (B, H, W, C) to check on; default two random images
            at the model's size.

    Returns {format: {"path", "max_difference", "outputs"}}; raises UserError
    naming the format and the difference when an artifact disagrees with Keras.
    """
    import tensorflow as tf

    from keras_vit.export import archive
    from keras_vit.model.features import feature_model

    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise UserError(f"Unknown feature export format(s) {unknown}: use {', '.join(FORMATS)}.")
    if "tflite" in formats and model.config.quantization:
        raise UserError(f"TFLite has no kernels for a {model.config.quantization} model's feature maps: export "
                        f"them as saved_model, or the float model's as tflite.")
    features = feature_model(model.with_preprocessing(), indices, output_format, norm)
    height, width = (None, None) if model.dynamic_image_size else model.image_size
    spec = tf.TensorSpec((None, height, width, model.num_channels), tf.float32, name="images")
    if images is None:
        images = np.random.default_rng(0).uniform(0, 255, (2, *model.image_size, model.num_channels))
    images = np.asarray(images, np.float32)
    expected = {name: np.asarray(value) for name, value in features(images).items()}
    storage.makedirs(out)
    saved = os.path.join(out, "features_saved_model")
    # Each weight once (keras_vit.export.archive: Keras' ExportArchive stores it twice).
    archive.write(saved, {"serving_default": (lambda x: features(x, training=False), [spec])})
    report = {}
    if "saved_model" in formats:
        served = tf.saved_model.load(saved).signatures["serving_default"]
        got = {name: value.numpy() for name, value in served(images=tf.constant(images)).items()}
        report["saved_model"] = _checked("saved_model", saved, got, expected)
    if "tflite" in formats:
        path = os.path.join(out, "features.tflite")
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        content = converter.convert()
        storage.write_bytes(path, lambda f: f.write(content))
        report["tflite"] = _checked("tflite", path, _run_tflite(content, images), expected)
    return report


def _run_tflite(content, images):
    """LiteRT's signature runner, one image per call (a resizable input takes each image's size)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    runner = interpreter.get_signature_runner("serving_default")
    outputs = [runner(images=image[None]) for image in images]
    return {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}


def _checked(fmt, path, got, expected):
    if sorted(got) != sorted(expected):
        raise UserError(f"The {fmt} feature artifact returns {sorted(got)}, Keras {sorted(expected)}.")
    difference = max(float(np.abs(got[name] - expected[name]).max()) for name in expected)
    scale = max(float(np.abs(value).max()) for value in expected.values())
    if difference > MAX_DIFFERENCE * max(scale, 1.0):
        raise UserError(f"The {fmt} feature artifact differs from Keras by {difference:.3g} (limit "
                        f"{MAX_DIFFERENCE:g} x {scale:.3g}): {path}.")
    return {"path": path, "max_difference": difference,
            "outputs": {name: tuple(value.shape) for name, value in expected.items()}}
