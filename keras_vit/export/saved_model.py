"""SavedModel for TF Serving: two signatures, labels shipped as an asset.

    serving_default(images: float32 (B, H, W, C), pixels 0..255; any H and W
                    for a model built with dynamic_image_size=True)
    serving_bytes(image_bytes: string (B,), encoded JPEG/PNG/GIF/BMP/WebP)
        -> probabilities (B, classes), top_k_ids (B, k) int32,
           top_k_probabilities (B, k), top_k_labels (B, k) string

The bytes signature decodes and resizes in the graph to the pixels `keras-vit
predict` gives the same file (keras_vit.export.image_bytes: EXIF orientation,
16-bit, palette, alpha, grayscale, resize, rounding), at the model's size (its
image_size for a dynamic model; for a NaFlex model, SigLIP2's, each image at its own
aspect ratio and the most patches its table holds, keras_vit.model.naflex.naflex_size,
as `keras-vit predict` reads it), then normalises as serving_default.
Undecodable bytes, and files it cannot decode as Pillow does, raise
InvalidArgumentError inside the op: TF Serving answers that request with an
error and goes on serving.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from keras_vit.export.format import Build, ExportFormat
from keras_vit.errors import UserError

SIGNATURES = ("serving_default", "serving_bytes")
DECODABLE_CHANNELS = (1, 3)  # what image files decode to (keras_vit.images.load_image)


def check(model):
    channels = int(model.inputs[0].shape[-1])
    if channels not in DECODABLE_CHANNELS:
        raise UserError(f"The SavedModel's bytes signature decodes images to 1 or 3 channels; "
                         f"{model.name} takes {channels}.")


def write(model, labels, path, top_k=5, max_num_patches=None):
    """Writes the SavedModel directory `path` (which must not exist); `max_num_patches`: a NaFlex
    model's patch budget in serving_bytes (keras_vit.model.naflex.patch_budget; None: the table's)."""
    import tensorflow as tf

    from keras_vit.export import archive
    from keras_vit.export import image_bytes as bytes_lib
    from keras_vit.export import serving

    from keras_vit.model.naflex import is_naflex, patch_budget

    check(model)
    naflex = is_naflex(model)
    height, width, channels = serving.input_size(model)
    served = (None, None) if serving.is_dynamic(model) else (height, width)
    k = min(int(top_k), len(labels))

    # The labels file becomes the SavedModel's assets/labels.txt.
    labels_dir = tempfile.mkdtemp(prefix="labels-", dir=os.path.dirname(os.path.abspath(path)))
    labels_file = os.path.join(labels_dir, "labels.txt")
    with open(labels_file, "w", encoding="utf-8") as f:
        f.write("\n".join(labels) + "\n")
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(
            labels_file, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
            tf.string, tf.lookup.TextFileIndex.WHOLE_LINE),
        default_value="")

    def classify(images):
        return outputs_of(serving.probabilities(model, images))  # (B, classes)

    def outputs_of(probs):
        top_probs, top_ids = tf.math.top_k(probs, k=k)  # (B, k) each
        return {
            "probabilities": probs,
            "top_k_ids": top_ids,
            "top_k_probabilities": top_probs,
            "top_k_labels": table.lookup(tf.cast(top_ids, tf.int64)),
        }

    def decode(encoded):
        return bytes_lib.load_image(encoded, (height, width), channels)

    def classify_bytes(image_bytes):
        if naflex:  # each image at its own NaFlex size, so each through the model alone
            return outputs_of(tf.map_fn(classify_naflex, image_bytes,
                                        fn_output_signature=tf.TensorSpec((int(model.outputs[0].shape[-1]),), tf.float32)))
        images = tf.map_fn(decode, image_bytes,
                           fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32))
        return classify(images)

    def classify_naflex(encoded):
        image = bytes_lib.load_image_naflex(encoded, model.config.total_stride, patch_budget(model, max_num_patches),
                                             channels)
        return serving.probabilities(model, image[None])[0]

    endpoints = {
        "serving_default": (classify, [tf.TensorSpec((None, *served, channels), tf.float32, name="images")]),
        "serving_bytes": (classify_bytes, [tf.TensorSpec((None,), tf.string, name="image_bytes")]),
    }
    try:  # each weight once (keras_vit.export.archive: Keras' ExportArchive stores it twice)
        archive.write(path, endpoints, resources=[table])
    finally:
        shutil.rmtree(labels_dir)


def _build(job: Build):
    write(job.model, job.labels, job.path, top_k=job.top_k, max_num_patches=job.max_num_patches)
    notes = {"signatures": list(SIGNATURES), "top_k": min(job.top_k, len(job.labels))}
    if job.max_num_patches is not None:  # serving_bytes' NaFlex budget, when not the table's
        notes["max_num_patches"] = job.max_num_patches
    return notes


def _labels_served(outputs, class_names):
    """Both signatures' top_k_labels must be the labels asset's names of top_k_ids."""
    problems = []
    for prefix in ("", "bytes_"):
        expected = np.asarray(class_names)[outputs[prefix + "top_k_ids"]]
        if not np.array_equal(outputs[prefix + "top_k_labels"], expected):
            problems.append(f"{prefix or 'serving_default '}top_k_labels do not match the labels asset")
    return problems


EXPORT_FORMATS = (ExportFormat(
    name="saved_model",
    description="SavedModel for TF Serving: pixels or encoded images in, probabilities and top-k labels out",
    layout="{name}/{version}",  # TF Serving serves the highest version under <out>/<name>/
    runtime="saved_model",
    build=_build,
    check=check,
    check_outputs=_labels_served,
),)
