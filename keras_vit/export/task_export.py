"""The export of a run whose Task's model is not a classifier (keras_vit.tasks: a mask per
pixel, a depth map, ...): a SavedModel for TF Serving whose signatures serve the Task's
outputs, and for the per-pixel Tasks a TFLite file.

    <out>/<name>/<version>/   serving_default(images: float32 (B, H, W, C), pixels 0..255)
                              serving_bytes(image_bytes: string (B,), encoded images)
                                  -> the Task's outputs (Task.serving_outputs), e.g. mask (B, H, W)
    <out>/<name>.tflite       serving_default's outputs for one image (1, H, W, C), builtin ops only
    <out>/report.json         what was exported and how it agreed with Keras

Images are scaled inside as the run trained (the ViT's pixel normalisation), and serving_bytes
decodes and resizes as `keras-vit predict` does. A segmentation or depth run's serving_bytes
answers at each image's own size (Task.at_size): a batch of sizes is padded to its largest
(a mask with 255, probabilities and depth with 0) and `image_size` (B, 2) says each one's.
A model for any size (`--dynamic-image-size`, and by default a run whose ViT has rotary
positions: DINOv3) takes each image at its own aspect ratio within the run's number of patches
(the NaFlex size rule) instead of squeezing it to the run's size, and its serving_default and
TFLite take any height and width that are multiples of the patch size.
Before it is installed, each artifact is loaded back and compared with Keras on the
validation images: float outputs within 1e-4 of their scale, integer outputs
(a mask's classes) equal on all but 0.1% of their values (a near-tie may fall either way).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import numpy as np

from keras_vit.errors import CannotContinue, UserError
from keras_vit.model.patch_grid import task_model

FORMAT = "saved_model"
TFLITE = "tflite"
TOLERANCE = 1e-4


def export_task_run(path, task, formats=None, out="exports", *, validation_data=None, name=None,
                    version: Optional[int] = None, overwrite: bool = False, verbose: bool = True,
                    dynamic_image_size: bool = False) -> Dict:
    """Exports the run at `path` (its model.keras) as the SavedModel of its `task`; returns the report.
    dynamic_image_size: the artifacts take any size (a run whose ViT has rotary positions always does)."""
    from keras_vit import runs
    from keras_vit.export import install as install_lib
    from keras_vit.export.source import _safe_name

    asked = _formats(formats)
    allowed = [FORMAT, TFLITE] if hasattr(task, "at_size") else [FORMAT]
    if [f for f in asked if f not in allowed] or FORMAT not in asked:
        others = ", ".join(f for f in asked if f not in allowed) or "without saved_model"
        kinds = f"{FORMAT} only" if allowed == [FORMAT] else " and ".join(allowed)
        raise UserError(f"{others}: the {task.name} task's model is not a classifier, and it exports as {kinds} "
                        f"(its outputs: Task.serving_outputs): give --formats {','.join(allowed)}.")
    replacing = install_lib.check_out(out, overwrite)
    model = _sized(task_model(runs.load_model(path), "export"), task, dynamic_image_size)
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
        rows = [{"format": FORMAT, "path": os.path.join(out, name, str(version)), **agreement}]
        if TFLITE in asked:
            rows.append({"format": TFLITE, "path": os.path.join(out, f"{name}.tflite"),
                         **_tflite(model, task, os.path.join(built, f"{name}.tflite"), images)})
        passed = all(row["passed"] for row in rows)
        report = {"task": task.name, "source": str(path), "name": name, "version": version,
                  "replaced": replacing, "any_size": bool(model.dynamic_image_size), "artifacts": rows, "passed": passed}
        with open(os.path.join(built, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        if not passed:
            problems = "; ".join(f"{row['format']}: {row['problems']}" for row in rows if not row["passed"])
            raise CannotContinue(f"The export of {path} does not agree with Keras: {problems}; nothing was "
                                 f"installed in {out}.")
        install_lib.install(built, out)
    finally:
        install_lib.discard_staging(staging, made)
    if verbose:
        print(f"[export] {summary_line(report)}", flush=True)
    return report


def _sized(model, task, dynamic_image_size):
    """The run's model as its artifacts take images: at any size where asked or where its ViT
    has rotary positions (DINOv3: the same weights answer at every grid), else at the run's."""
    per_pixel = hasattr(task, "at_size")
    if dynamic_image_size and not per_pixel:
        raise UserError(f"--dynamic-image-size: the {task.name} task's outputs do not resize with the image; "
                        f"drop it (its artifacts take the run's size).")
    if dynamic_image_size or (model.rotary and per_pixel):
        return model.with_image_size(dynamic_image_size=True)
    return model


def summary_line(report) -> str:
    """The export of a Task run in one line (what `keras-vit export --quiet` prints)."""
    lines = []
    for row in report["artifacts"]:
        how = "serving_default, serving_bytes" if row["format"] == FORMAT else "one image"
        lines.append(f"{row['format']}: {row['path']} ({how} -> {', '.join(row['outputs'])}); agrees with Keras on "
                     f"{row['validation_images']} images (largest difference {row['max_abs_diff']:.2g})")
        if row.get("other_size"):
            lines[-1] += (f"; serving_bytes answers at the image's size ({row['other_size']})" if row["format"] == FORMAT
                          else f"; and at {row['other_size']}")
        if report.get("any_size") and row["format"] == FORMAT:
            lines[-1] += "; takes any size (each image at its own aspect ratio)"
    return "\n[export] ".join(lines)


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
    any_size = model.dynamic_image_size

    def serve(images):
        return task.serve(model, images)

    def serve_bytes(image_bytes):
        if any_size:
            return at_own_aspect(model, task, image_bytes)

        def load(encoded):  # each image decoded once: its pixels at the run's size, and its own size
            image = bytes_lib.decode(encoded, channels)
            return bytes_lib.resized_pixels(image, (height, width)), tf.shape(image)[:2]

        images, sizes = tf.map_fn(load, image_bytes, fn_output_signature=(
            tf.TensorSpec((height, width, channels), tf.float32), tf.TensorSpec((2,), tf.int32)))
        outputs = serve(images)
        if not hasattr(task, "at_size"):
            return outputs
        return {**at_image_sizes(task, outputs, sizes), "image_size": sizes}

    side = (None, None) if any_size else (height, width)
    archive.write(path, {
        "serving_default": (serve, [tf.TensorSpec((None, *side, channels), tf.float32, name="images")]),
        "serving_bytes": (serve_bytes, [tf.TensorSpec((None,), tf.string, name="image_bytes")]),
    })


def at_own_aspect(model, task, image_bytes):
    """serving_bytes of a model for any size: each image run at its own aspect ratio within the
    run's patches (one image at a time: their grids differ), its outputs brought to its own size
    and padded to the batch's largest, as at_image_sizes pads them."""
    import tensorflow as tf

    from keras_vit.export import image_bytes as bytes_lib

    # PatchGridModel.own_size_rule in TF ops (load_image_naflex): what predict reads, in the graph.
    channels, stride, budget = model.input_size[-1], model.vit.config.total_stride, model.patch_budget
    # Every image's (upright) size first: the padding needs the largest before any image is run.
    # That decodes each image a second time, a small cost beside a ViT's forward pass.
    sizes = tf.map_fn(lambda encoded: tf.shape(bytes_lib.decode(encoded, channels))[:2], image_bytes,
                      fn_output_signature=tf.TensorSpec((2,), tf.int32))
    tallest, widest = tf.reduce_max(sizes[:, 0]), tf.reduce_max(sizes[:, 1])

    def one(args):
        encoded, size = args
        pixels = bytes_lib.load_image_naflex(encoded, stride, budget, channels)
        own = task.at_size({k: v[0] for k, v in task.serve(model, pixels[None]).items()}, size[0], size[1])
        return _padded(task, own, size, tallest, widest)

    # One patch's outputs, traced for their ranks and dtypes alone (nothing reads them: never run).
    probe = task.serve(model, tf.zeros((1, stride, stride, channels)))
    example = task.at_size({k: v[0] for k, v in probe.items()}, 1, 1)
    signature = {k: tf.TensorSpec((None, None, *v.shape[2:]), v.dtype) for k, v in example.items()}
    return {**tf.map_fn(one, (image_bytes, sizes), fn_output_signature=signature), "image_size": sizes}


def at_image_sizes(task, outputs, sizes):
    """A batch of a dense Task's outputs (at the model's size), each at its image's own size
    (`sizes` (B, 2)), padded to the batch's largest with the Task's padding values."""
    import tensorflow as tf

    tallest, widest = tf.reduce_max(sizes[:, 0]), tf.reduce_max(sizes[:, 1])

    def one(args):
        own, size = args
        return _padded(task, task.at_size(own, size[0], size[1]), size, tallest, widest)

    example = task.at_size({k: v[0] for k, v in outputs.items()}, sizes[0, 0], sizes[0, 1])
    signature = {k: tf.TensorSpec((None, None, *v.shape[2:]), v.dtype) for k, v in example.items()}
    return tf.map_fn(one, (outputs, sizes), fn_output_signature=signature)


def _padded(task, outputs, size, tallest, widest):
    """One image's outputs at its own `size` padded to tallest x widest with the Task's values."""
    import tensorflow as tf

    return {key: tf.pad(value, [[0, tallest - size[0]], [0, widest - size[1]]] + [[0, 0]] * (value.shape.rank - 2),
                        constant_values=tf.cast(task.padding[key], value.dtype)) for key, value in outputs.items()}


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
            largest = max(largest, _compare(f"{signature} {key}", outputs[key].numpy(), expected, problems))
    row = {"passed": not problems, "problems": "; ".join(problems), "max_abs_diff": largest,
           "outputs": sorted(keras_outputs), "validation_images": int(len(images))}
    if hasattr(task, "at_size"):
        row.update(_other_size(model, task, loaded, images[0], problems))
        row.update(passed=not problems, problems="; ".join(problems))
    return row


def _other_size(model, task, loaded, image, problems) -> Dict:
    """serving_bytes on an image of another size and aspect: its outputs at that size, as Keras
    gives them at the model's size (or, for a model of any size, at the image's own aspect
    ratio) resized by the Task (Task.at_size)."""
    import tensorflow as tf
    from PIL import Image

    from keras_vit.export import image_bytes as bytes_lib

    height, width, channels = model.input_size
    pixels = np.asarray(Image.fromarray(np.round(image).astype(np.uint8).squeeze()).resize(
        (width * 3 // 2 + 1, height + 3)))
    encoded = _png(pixels.reshape(pixels.shape[0], pixels.shape[1], -1))
    served = loaded.signatures["serving_bytes"](image_bytes=tf.constant([encoded]))
    if model.dynamic_image_size:  # Keras at the image's own aspect ratio: another grid than the run's
        resized = bytes_lib.load_image_naflex(tf.constant(encoded), model.vit.config.total_stride,
                                              model.patch_budget, channels)
    else:
        resized = bytes_lib.load_image(tf.constant(encoded), (height, width), channels)
    keras_outputs = task.serve(model, resized[None])
    expected = task.at_size({k: v[0] for k, v in keras_outputs.items()}, pixels.shape[0], pixels.shape[1])
    where = f"serving_bytes of a {pixels.shape[1]}x{pixels.shape[0]} image"
    for key, value in expected.items():
        _compare(f"{where}: {key}", served[key].numpy()[0], value.numpy(), problems)
    return {"other_size": f"{pixels.shape[1]}x{pixels.shape[0]}"}


def _tflite(model, task, path, images) -> Dict:
    """The SavedModel's serving_default as TFLite (builtin ops only) at `path`, compared with Keras."""
    import tempfile

    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.export import archive, tflite

    height, width, channels = model.input_size
    # Through a SavedModel of one image's signature, as every TFLite export here is converted.
    with tempfile.TemporaryDirectory() as scratch:
        side = (None, None) if model.dynamic_image_size else (height, width)
        archive.write(scratch, {"serving_default": (lambda images: task.serve(model, images),
                                                    [tf.TensorSpec((1, *side, channels), tf.float32,
                                                                   name="images")])})
        content, _ = tflite.convert(scratch, "tflite")
    with open(path, "wb") as f:
        f.write(content)
    runner = Interpreter(model_content=content).get_signature_runner()
    expected = {k: np.asarray(v) for k, v in task.serve(model, tf.constant(images, tf.float32)).items()}
    got = [runner(images=np.asarray(image, np.float32)[None]) for image in images]
    got = {key: np.concatenate([g[key] for g in got]) for key in got[0]}
    problems, largest = [], 0.0
    if sorted(got) != sorted(expected):
        problems.append(f"outputs {sorted(got)}, Keras {sorted(expected)}")
    for key in sorted(set(got) & set(expected)):
        largest = max(largest, _compare(key, got[key], expected[key], problems))
    row = {"outputs": sorted(expected), "validation_images": int(len(images))}
    if model.dynamic_image_size and not problems:  # and at another grid, one patch taller and two wider
        stride = model.vit.config.total_stride
        other = tf.image.resize(tf.constant(images[:1], tf.float32), (height + stride, width + 2 * stride)).numpy()
        got, expected = runner(images=other), task.serve(model, tf.constant(other))
        where = f"at {width + 2 * stride}x{height + stride}"
        for key in expected:
            largest = max(largest, _compare(f"{where}: {key}", got[key], np.asarray(expected[key]), problems))
        row["other_size"] = f"{width + 2 * stride}x{height + stride}"
    return {"passed": not problems, "problems": "; ".join(problems), "max_abs_diff": largest, **row}


def _compare(where: str, got, expected, problems: list) -> float:
    """One output against Keras': floats within `tolerance`, class ids equal on all but 0.1% (a
    near-tie may fall either way); a problem appended in words -> the largest float difference."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        problems.append(f"{where}: shape {got.shape}, Keras {expected.shape}")
        return 0.0
    if np.issubdtype(expected.dtype, np.floating):
        if not np.isfinite(got).all():
            problems.append(f"{where}: not finite")
            return 0.0
        difference = float(np.max(np.abs(got - expected))) if got.size else 0.0
        if difference > tolerance(expected):
            problems.append(f"{where}: differs from Keras by {difference:.2g}")
        return difference
    if np.mean(got != expected) > 1e-3:
        problems.append(f"{where}: {np.mean(got != expected):.2%} differ from Keras")
    return 0.0


def tolerance(expected) -> float:
    """How far a float output may be from Keras': 1e-4 of its scale (at least 1e-4: depth in metres
    runs to tens, probabilities to 1)."""
    return TOLERANCE * max(1.0, float(np.max(np.abs(expected))) if np.size(expected) else 1.0)


def _png(pixels) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(buffer, format="PNG")
    return buffer.getvalue()
