"""The exports of an image-text model (SigLIP, SigLIP2, CLIP, MetaCLIP 2).

`--tower image` (the default), with labels: a zero-shot classifier, the image tower with the
labels' embeddings baked in as constants (no text tower, no tokenizer at serving time).

    <out>/<name>/<version>/   serving_default(images: float32 (B, H, W, C), pixels 0..255)
                              serving_bytes(image_bytes: string (B,), encoded images)
                                  -> probabilities (B, labels): the family's own reading
    <out>/<name>.tflite       pixels (1, H, W, C) -> probabilities, builtin ops only, the labels
                              in its metadata
    <out>/labels.txt          the labels, one per line, in the order of the probabilities

`--tower text`: the text tower as a SavedModel taking token ids (what model.tokenize gives):
serving_default(token_ids, token_mask: int32 (B, L)) -> embeddings (B, E).

Pixels are read by serving_bytes as the checkpoint's image processor reads them (CLIP's
shorter side resized and centre cropped, the others resized whole; SigLIP2 at the table's
size) and scaled as the image tower takes them. Every artifact is loaded back and compared with
the Keras model before it is installed: probabilities and embeddings within 1e-4.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import numpy as np

from keras_vit.errors import CannotContinue, UserError

TOLERANCE = 1e-4
TOWERS = ("image", "text")
FORMATS = ("saved_model", "tflite")
# Texts the text tower's export is validated on (besides the labels, when given).
_SAMPLE_TEXTS = ["a photo of a cat", "A Dog!", "two birds on a wire, at sunset", "x"]


def export_image_text(source, labels: Optional[List[str]] = None, formats=None, out: str = "exports", *,
                      templates=None, tower: str = "image", name: Optional[str] = None, version: Optional[int] = None,
                      overwrite: bool = False, validation_data=None, verbose: bool = True) -> Dict:
    """Exports the image-text model `source` (anything from_pretrained(task="image_text") takes)."""
    from keras_vit.export import install as install_lib
    from keras_vit.export.source import _safe_name
    from keras_vit.model.image_text import check_labels
    from keras_vit.model.pretrained import from_pretrained

    if tower not in TOWERS:
        raise UserError(f"--tower {tower}: choose image (a zero-shot classifier) or text (the text tower).")
    asked = _formats(formats, tower)
    if tower == "image":
        if not labels:
            raise UserError("A zero-shot classifier needs its labels: give --labels a,b,c (or a file of labels, "
                            "one per line).")
        labels = check_labels(labels)
    replacing = install_lib.check_out(out, overwrite)
    model = from_pretrained(source, task="image_text")
    name = _safe_name(name or os.path.basename(os.path.normpath(str(source).split(":")[-1])))
    version = version or 1
    staging, made = install_lib.make_staging(out)
    try:
        built = os.path.join(staging, "export")
        os.makedirs(built)
        if tower == "image":
            rows = _export_classifier(model, labels, templates, asked, built, name, version, validation_data)
            with open(os.path.join(built, "labels.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(labels) + "\n")
        else:
            rows = [_export_text_tower(model, os.path.join(built, name, str(version)), labels)]
        for row in rows:
            row["path"] = os.path.join(out, os.path.relpath(row.pop("built"), built))
        report = {"image_text": model.family, "tower": tower, "source": str(source), "name": name,
                  "version": version, "replaced": replacing, "labels": labels, "artifacts": rows,
                  "passed": all(row["passed"] for row in rows)}
        with open(os.path.join(built, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        if not report["passed"]:
            problems = "; ".join(row["problems"] for row in rows if row["problems"])
            raise CannotContinue(f"the export of {source} does not agree with Keras: {problems}; nothing was "
                                 f"installed in {out}.")
        install_lib.install(built, out)
    finally:
        install_lib.discard_staging(staging, made)
    if verbose:
        for row in rows:
            print(f"[export] {summary_line(row)}", flush=True)
    return report


def summary_line(row) -> str:
    return (f"{row['format']}: {row['path']} -> {', '.join(row['outputs'])}; agrees with Keras on "
            f"{row['validation_inputs']} inputs (largest difference {row['max_abs_diff']:.2g})")


def _formats(formats, tower) -> List[str]:
    names = [FORMATS[0]] if formats is None else (formats.split(",") if isinstance(formats, str) else list(formats))
    names = [n.strip().replace("-", "_") for n in names if n.strip()] or [FORMATS[0]]
    allowed = FORMATS if tower == "image" else FORMATS[:1]
    others = [n for n in names if n not in allowed]
    if others:
        raise UserError(f"{', '.join(others)}: an image-text model's {tower} tower exports as "
                        f"{' and '.join(allowed)}: give --formats {','.join(allowed)}.")
    return names


# --- the zero-shot classifier ---

def _classifier(model, labels, templates):
    """(serve(pixels 0..255) -> {"probabilities"}, keras_probabilities(pixels) numpy) of the labels."""
    import tensorflow as tf

    from keras_vit import images as images_lib

    tower = model.image_tower
    matrix = model.label_embeddings(labels, templates)
    matrix = tf.constant(matrix / np.linalg.norm(matrix, axis=-1, keepdims=True), tf.float32)
    scale = tf.exp(tf.constant(float(model.logit_scale.numpy()), tf.float32))
    bias = 0.0 if model.logit_bias is None else float(model.logit_bias.numpy())
    normalization = images_lib.pixel_normalization(tower)

    def serve(pixels):
        x = images_lib.normalize(tf.cast(pixels, tf.float32), normalization)
        embedding = tf.cast(tower(x, training=False), tf.float32)
        embedding = embedding / tf.norm(embedding, axis=-1, keepdims=True)
        logits = tf.matmul(embedding, matrix, transpose_b=True) * scale + bias
        probabilities = tf.sigmoid(logits) if model.loss_kind == "sigmoid" else tf.nn.softmax(logits, axis=-1)
        return {"probabilities": probabilities}

    def keras_probabilities(pixels):
        x = images_lib.normalize(np.asarray(pixels, np.float32), normalization)
        return model.zero_shot(np.asarray(x), labels, templates)

    return serve, keras_probabilities


def _export_classifier(model, labels, templates, formats, built, name, version, validation_data) -> List[Dict]:
    import tensorflow as tf

    from keras_vit.export import archive
    from keras_vit.model.processor import read_processor

    tower = model.image_tower
    height, width = tower.image_size
    channels = tower.num_channels
    serve, keras_probabilities = _classifier(model, labels, templates)
    processor = read_processor(model)
    pixels = _validation_pixels(tower, validation_data)
    rows = []
    if "saved_model" in formats:
        path = os.path.join(built, name, str(version))

        def serve_bytes(image_bytes):
            images = tf.map_fn(lambda encoded: _processed(encoded, processor, (height, width), channels),
                               image_bytes, fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32))
            return serve(images)

        archive.write(path, {
            "serving_default": (serve, [tf.TensorSpec((None, height, width, channels), tf.float32, name="images")]),
            "serving_bytes": (serve_bytes, [tf.TensorSpec((None,), tf.string, name="image_bytes")]),
        })
        rows.append(_check_saved_model(path, pixels, keras_probabilities))
    if "tflite" in formats:
        rows.append(_tflite(serve, (height, width, channels), pixels, keras_probabilities, labels, built, name))
    return rows


def _processed(encoded, processor, size, channels):
    """serving_bytes' reading of one image, as keras_vit.model.processor reads a file."""
    import tensorflow as tf

    from keras_vit.export import image_bytes as bytes_lib

    pixels = tf.cast(bytes_lib.decode(encoded, channels), tf.float32)
    if processor.shortest_edge and processor.crop:
        shape = tf.cast(tf.shape(pixels)[:2], tf.float32)
        scaled = tf.cast(tf.round(shape * processor.shortest_edge / tf.reduce_min(shape)), tf.int32)
        scaled = tf.maximum(scaled, tf.constant(processor.crop, tf.int32))
        pixels = tf.image.resize(pixels, scaled, method="bilinear", antialias=True)
        top, left = (scaled[0] - processor.crop[0]) // 2, (scaled[1] - processor.crop[1]) // 2
        pixels = pixels[top:top + processor.crop[0], left:left + processor.crop[1]]
    pixels = tf.image.resize(pixels, size, method="bilinear", antialias=True)
    return tf.ensure_shape(tf.clip_by_value(pixels, 0.0, 255.0), (*size, channels))


def _validation_pixels(tower, validation_data):
    from keras_vit.export import data as data_lib

    size = tuple(tower.image_size)
    if validation_data is None:
        return data_lib.random_images(8, size, tower.num_channels).images
    return data_lib.load(validation_data, size, tower.num_channels).images[:32]


def _compare(name, got, expected, problems) -> float:
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        problems.append(f"{name}: shape {got.shape}, Keras {expected.shape}")
        return float("inf")
    difference = float(np.max(np.abs(got - expected))) if got.size else 0.0
    if difference > TOLERANCE:
        problems.append(f"{name}: differs from Keras by {difference:.2g}")
    return difference


def _check_saved_model(path, pixels, keras_probabilities) -> Dict:
    import tensorflow as tf

    from keras_vit.export.task_export import _png

    loaded = tf.saved_model.load(path)
    problems = []
    largest = _compare("serving_default", loaded.signatures["serving_default"](
        images=tf.constant(pixels, tf.float32))["probabilities"].numpy(), keras_probabilities(pixels), problems)
    rounded = np.round(pixels)  # what PNG keeps of them
    encoded = tf.constant([_png(image.astype(np.uint8)) for image in rounded])
    largest = max(largest, _compare("serving_bytes", loaded.signatures["serving_bytes"](
        image_bytes=encoded)["probabilities"].numpy(), keras_probabilities(rounded), problems))
    return {"format": "saved_model", "built": path, "passed": not problems, "problems": "; ".join(problems),
            "max_abs_diff": largest, "outputs": ["probabilities"], "validation_inputs": int(len(pixels))}


def _tflite(serve, shape, pixels, keras_probabilities, labels, built, name) -> Dict:
    import tempfile

    import tensorflow as tf

    from keras_vit.export import archive, tflite

    with tempfile.TemporaryDirectory() as scratch:
        archive.write(scratch, {"serving_default": (serve, [tf.TensorSpec((1, *shape), tf.float32, name="images")])})
        content, notes = tflite.convert(scratch, "tflite")
    path = os.path.join(built, f"{name}.tflite")
    with open(path, "wb") as f:
        f.write(tflite.with_labels(content, labels))
    problems = []
    largest = _compare("tflite", tflite.predict(content, np.asarray(pixels, np.float32)),
                       keras_probabilities(pixels), problems)
    return {"format": "tflite", "built": path, "passed": not problems, "problems": "; ".join(problems),
            "max_abs_diff": largest, "outputs": ["probabilities"], "validation_inputs": int(len(pixels)),
            "ops": notes["ops"]}


# --- the text tower ---

def _export_text_tower(model, path, labels) -> Dict:
    import tensorflow as tf

    from keras_vit.export import archive

    tower = model.text_tower

    def serve(token_ids, token_mask):
        return {"embeddings": tf.cast(tower(token_ids, model._mask(token_mask), training=False), tf.float32)}

    archive.write(path, {"serving_default": (serve, [tf.TensorSpec((None, None), tf.int32, name="token_ids"),
                                                     tf.TensorSpec((None, None), tf.int32, name="token_mask")])})
    texts = list(labels or []) + _SAMPLE_TEXTS
    tokens = model.tokenize(texts)
    loaded = tf.saved_model.load(path)
    got = loaded.signatures["serving_default"](token_ids=tf.constant(tokens["token_ids"]),
                                               token_mask=tf.constant(tokens["token_mask"]))["embeddings"].numpy()
    problems = []
    largest = _compare("serving_default", got, model.text_embeddings(tokens), problems)
    return {"format": "saved_model", "built": path, "passed": not problems, "problems": "; ".join(problems),
            "max_abs_diff": largest, "outputs": ["embeddings"], "validation_inputs": len(texts)}
