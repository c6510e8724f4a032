"""The export of a run whose Task's model is not a classifier (keras_vit.tasks: a mask per
pixel, ...): a SavedModel for TF Serving whose signatures serve the Task's outputs.

    <out>/<name>/<version>/   serving_default(images: float32 (B, H, W, C), pixels 0..255)
                              serving_bytes(image_bytes: string (B,), encoded images)
                                  -> the Task's outputs (Task.serving_outputs), e.g. mask (B, H, W)
    <out>/report.json         what was exported and how it agreed with Keras

Images are scaled inside as the run trained (the ViT's pixel normalisation), and serving_bytes
decodes and resizes as `keras-vit predict` does. Before it is installed, the SavedModel is
loaded back and both signatures are compared with Keras on the validation images: float
outputs within 1e-4, integer outputs (a mask's classes) equal on all but 0.1% of their values
(a near-tie may fall either way). The other formats serve a classifier and are refused.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import numpy as np

from keras_vit.errors import CannotContinue, UserError
from keras_vit.model.patch_grid import task_model

FORMAT = "saved_model"
TOLERANCE = 1e-4


def export_task_run(path, task, formats=None, out="exports", *, validation_data=None, name=None,
                    version: Optional[int] = None, overwrite: bool = False, verbose: bool = True) -> Dict:
    """Exports the run at `path` (its model.keras) as the SavedModel of its `task`; returns the report."""
    from keras_vit import runs
    from keras_vit.export import install as install_lib
    from keras_vit.export.source import _safe_name

    asked = _formats(formats)
    if asked != [FORMAT]:
        others = ", ".join(f for f in asked if f != FORMAT)
        raise UserError(f"{others}: the {task.name} task's model is not a classifier, and it exports as "
                        f"{FORMAT} only (its outputs: Task.serving_outputs): give --formats {FORMAT}.")
    replacing = install_lib.check_out(out, overwrite)
    model = task_model(runs.load_model(path), "export")
    name = _safe_name(name or os.path.basename(os.path.normpath(runs.workdir_of(path))))
    images = _validation_images(model, validation_data)
    staging, made = install_lib.make_staging(out)
    try:
        built = os.path.join(staging, "export")
        version = version or 1
        artifact = os.path.join(built, name, str(version))
        os.makedirs(os.path.dirname(artifact))
        _write(model, task, artifact)
        agreement = _validate(model, task, artifact, images)
        report = {"task": task.name, "source": str(path), "name": name, "version": version,
                  "replaced": replacing, "artifacts": [{"format": FORMAT, "path": os.path.join(out, name, str(version)),
                                                        "passed": agreement["passed"], **agreement}],
                  "passed": agreement["passed"]}
        with open(os.path.join(built, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        if not agreement["passed"]:
            raise CannotContinue(f"{FORMAT} of {path} does not agree with Keras: {agreement['problems']}; "
                                 f"nothing was installed in {out}.")
        install_lib.install(built, out)
    finally:
        install_lib.discard_staging(staging, made)
    if verbose:
        print(f"[export] {summary_line(report)}", flush=True)
    return report


def summary_line(report) -> str:
    """The export of a Task run in one line (what `keras-vit export --quiet` prints)."""
    row = report["artifacts"][0]
    return (f"{FORMAT}: {row['path']} (serving_default, serving_bytes -> {', '.join(row['outputs'])}); agrees "
            f"with Keras on {row['validation_images']} images (largest difference {row['max_abs_diff']:.2g})")


def _formats(formats):
    if formats is None:
        return [FORMAT]
    names = formats.split(",") if isinstance(formats, str) else list(formats)
    return [n.strip().replace("-", "_") for n in names if n.strip()] or [FORMAT]


def _validation_images(model, validation_data):
    from keras_vit.export import data as data_lib

    *size, channels = model.input_size
    if validation_data is None:
        return data_lib.random_images(8, tuple(size), channels).images
    return data_lib.load(validation_data, tuple(size), channels).images[:32]


def _write(model, task, path) -> None:
    import tensorflow as tf

    from keras_vit.export import archive
    from keras_vit.export import image_bytes as bytes_lib

    height, width, channels = model.input_size

    def serve(images):
        return task.serve(model, images)

    def serve_bytes(image_bytes):
        images = tf.map_fn(lambda encoded: bytes_lib.load_image(encoded, (height, width), channels), image_bytes,
                           fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32))
        return serve(images)

    archive.write(path, {
        "serving_default": (serve, [tf.TensorSpec((None, height, width, channels), tf.float32, name="images")]),
        "serving_bytes": (serve_bytes, [tf.TensorSpec((None,), tf.string, name="image_bytes")]),
    })


def _validate(model, task, path, images) -> Dict:
    """Both signatures of the SavedModel at `path`, loaded back, against Keras on `images`."""
    import tensorflow as tf

    keras_outputs = {k: np.asarray(v) for k, v in task.serve(model, tf.constant(images, tf.float32)).items()}
    loaded = tf.saved_model.load(path)
    encoded = tf.constant([_png(np.round(image).astype(np.uint8)) for image in images])
    problems, largest = [], 0.0
    pixels = tf.constant(np.round(images), tf.float32)  # what PNG keeps of them
    keras_rounded = {k: np.asarray(v) for k, v in task.serve(model, pixels).items()}
    for signature, argument, reference in (("serving_default", tf.constant(images, tf.float32), keras_outputs),
                                           ("serving_bytes", encoded, keras_rounded)):
        outputs = loaded.signatures[signature](**{"images" if signature == "serving_default" else "image_bytes":
                                                  argument})
        for key, expected in reference.items():
            got = outputs[key].numpy()
            if got.shape != expected.shape:
                problems.append(f"{signature} {key}: shape {got.shape}, Keras {expected.shape}")
            elif np.issubdtype(expected.dtype, np.floating):
                difference = float(np.max(np.abs(got - expected))) if got.size else 0.0
                largest = max(largest, difference)
                if difference > TOLERANCE:
                    problems.append(f"{signature} {key}: differs from Keras by {difference:.2g}")
            elif np.mean(got != expected) > 1e-3:  # class ids: a near-tie may fall either way
                problems.append(f"{signature} {key}: {np.mean(got != expected):.2%} differ from Keras")
    return {"passed": not problems, "problems": "; ".join(problems), "max_abs_diff": largest,
            "outputs": sorted(keras_outputs), "validation_images": int(len(images))}


def _png(pixels) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(buffer, format="PNG")
    return buffer.getvalue()
