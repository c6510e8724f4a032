"""`keras-vit quantize`: a run folder holding the model with int8 or int4 projections.

    keras-vit quantize runs/photos --mode int8 --out runs/photos-int8 --data photos/

OUT is a run folder like any other (model.keras, labels.txt), so predict,
inspect and export read it; quantization.json
beside them says what was quantised, the sizes, and how far the quantised
model's answers are from the float model's on --data.

A run of a Task whose model is not a classifier (keras_vit.tasks) has its ViT's
encoder quantised under the same head; OUT keeps the run's config.json, so
predict, evaluate and export read OUT by its Task, and the agreement is that of
the Task's served outputs.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from keras_vit.config import QUANTIZATION_MODES

REPORT_FILE = "quantization.json"


def add_arguments(parser):
    parser.add_argument("source", help="a run folder, a .keras file, or anything keras_vit.from_pretrained takes "
                                       "(an HF transformers, keras-hub or timm folder, a peft adapter, hf:ORG/NAME, "
                                       "imagenet21k:B/16, ...)")
    parser.add_argument("--mode", default="int8", metavar="|".join(QUANTIZATION_MODES),
                        help="int8 (weights per channel, activations per token) or int4 (weights only, groups of "
                             "128 rows: smallest). Default: int8")
    parser.add_argument("--out", required=True, help="the new run folder")
    parser.add_argument("--overwrite", action="store_true", help="replace a run folder already at --out")
    parser.add_argument("--data", help="images to compare the quantised model with the float one on: a folder "
                                       "(class sub-folders give accuracy), 'mnist', an .npz or .npy. Default: "
                                       "none (sizes only)")
    parser.add_argument("--num-images", type=int, default=500,
                        help="images of --data at most, a seeded sample across classes (default 500)")
    parser.add_argument("--labels", help="class names, one per line (default: the model's own, else its run's)")


def run(args):
    from keras_vit import runs
    from keras_vit.errors import UserError
    from keras_vit.model.quantization import check_mode, quantize, weight_bytes
    from keras_vit.export.serving import input_size
    from keras_vit.runs.source import open_model

    check_mode(args.mode)
    out = os.fspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} is a file: give a folder for the quantised run.")
    if os.path.exists(out) and os.listdir(out) and not args.overwrite:
        raise UserError(f"--out {out} holds files already: choose a new folder, or pass --overwrite to replace it.")
    source_path = os.path.realpath(os.fspath(args.source))
    if os.path.exists(source_path) and os.path.realpath(out) in (source_path, os.path.dirname(source_path)):
        raise UserError(f"--out {out} is the source itself: the quantised run goes to a folder of its own.")
    from keras_vit.tasks import run_task

    task = run_task(args.source)
    if task is not None:
        return _task_run(args, task, out)
    source = open_model(args.source, args.labels)
    model = source.model
    if not hasattr(model, "config"):
        raise UserError(f"{args.source} is not a keras_vit ViT: keras-vit quantize quantises the encoder blocks of "
                        f"keras_vit models (any family).")
    data = _images(args.data, input_size(model), args.num_images)
    print(f"{source.description}: {model.count_params():,} parameters; quantising the encoder blocks' "
          f"{6 * model.config.num_layers} projections to {args.mode}", flush=True)
    start = time.perf_counter()
    quantized = quantize(model, args.mode)
    report = {"source": os.fspath(args.source), "mode": args.mode,
              "seconds": round(time.perf_counter() - start, 1),
              "weights_bytes": {"float": weight_bytes(model), args.mode: weight_bytes(quantized)}}
    if data is not None:
        report["agreement"] = _agreement(model, quantized, data)
    def labels(staging):
        if source.labels is not None and getattr(quantized, "include_top", False):
            runs.write_labels(staging, source.labels, quantized.num_classes)

    _write_run(out, quantized, report, labels)
    return 0


def _write_run(out, quantized, report, add_files) -> None:
    """The quantised run folder `out`, written beside it and renamed into place: model.keras,
    what `add_files(folder)` puts there (labels, the run's config), quantization.json."""
    from keras_vit import runs

    staging = out.rstrip("/") + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    add_files(staging)
    runs.save_model(staging, quantized)
    report["file_bytes"] = os.path.getsize(os.path.join(staging, runs.MODEL_FILE))
    with open(os.path.join(staging, REPORT_FILE), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(staging, out)
    _print(report, out)


def _task_run(args, task, out) -> int:
    """A run of `task`: its ViT quantised under the same head, the run's config.json kept."""
    import numpy as np

    from keras_vit import runs
    from keras_vit.model.quantization import quantize, weight_bytes
    from keras_vit.runs.folder import CONFIG_FILE, LABELS_FILE
    from keras_vit.model import PatchGridModel, task_model

    model = task_model(runs.load_model(args.source), "quantize")
    print(f"{args.source} ({task.name}): {model.count_params():,} parameters; quantising the encoder blocks' "
          f"{6 * model.vit.config.num_layers} projections to {args.mode}", flush=True)
    start = time.perf_counter()
    quantized = PatchGridModel(quantize(model.vit, args.mode), model.head, blocks=model.blocks, name=model.name)
    report = {"source": os.fspath(args.source), "mode": args.mode, "task": task.name,
              "seconds": round(time.perf_counter() - start, 1),
              "weights_bytes": {"float": weight_bytes(model), args.mode: weight_bytes(quantized)}}
    if args.data is not None:
        images = _images(args.data, model.input_size, args.num_images).images
        reference, answers = task.serve(model, images), task.serve(quantized, images)
        floats = [k for k in reference if np.asarray(reference[k]).dtype.kind == "f"]
        report["agreement"] = {"images": len(images), "data": os.fspath(args.data), "max_abs_diff": max(
            [float(np.max(np.abs(np.asarray(answers[k]) - np.asarray(reference[k])))) for k in floats] or [0.0]),
            # an integer output (a mask's classes): the share of its values the quantised model keeps
            "equal": {k: float(np.mean(np.asarray(answers[k]) == np.asarray(reference[k])))
                      for k in reference if k not in floats}}
    workdir = runs.workdir_of(args.source)

    def run_files(staging):  # the Task, as predict, evaluate and export read it
        for name in (CONFIG_FILE, LABELS_FILE):
            if os.path.isfile(os.path.join(workdir, name)):
                shutil.copyfile(os.path.join(workdir, name), os.path.join(staging, name))

    _write_run(out, quantized, report, run_files)
    return 0


def _images(spec, shape, limit):
    """The sample of --data to compare on (pixels 0..255 at `shape`: height, width,
    channels), or None without --data."""
    if spec is None:
        return None
    from keras_vit.export import data as data_lib

    *size, channels = shape
    return data_lib.load_sample(spec, tuple(size), channels, limit)


def _outputs(model, pixels):
    """Probabilities of a classifier, or the embeddings of a backbone, for pixels 0..255."""
    import numpy as np

    from keras_vit.export import serving

    if model.include_top:
        return serving.keras_probabilities(model, pixels)
    from keras_vit.model.vit import preprocess_input

    inputs = pixels if model.include_preprocessing else preprocess_input(pixels, model.config.pixel_normalization)
    return np.asarray(model.predict(inputs, batch_size=64, verbose=0))


def _agreement(model, quantized, data) -> dict:
    """How far the quantised model's answers are from the float model's on `data`."""
    import numpy as np

    reference, answers = _outputs(model, data.images), _outputs(quantized, data.images)
    result = {"images": len(data.images), "data": data.source,
              "max_abs_diff": float(np.abs(answers - reference).max())}
    if model.include_top:
        result["top1_agreement"] = float(np.mean(answers.argmax(1) == reference.argmax(1)))
        if data.labels is not None:
            result["accuracy"] = {"float": float(np.mean(reference.argmax(1) == data.labels)),
                                  "quantized": float(np.mean(answers.argmax(1) == data.labels))}
    else:
        cosine = np.sum(answers * reference, 1) / (
            np.linalg.norm(answers, axis=1) * np.linalg.norm(reference, axis=1) + 1e-12)
        result["min_cosine"] = float(cosine.min())
    return result


def _print(report, out):
    mode, sizes = report["mode"], report["weights_bytes"]
    print(f"weights in memory: {_mb(sizes['float'])} float -> {_mb(sizes[mode])} {mode} "
          f"({sizes[mode] / sizes['float']:.2f}x); {out}/model.keras {_mb(report['file_bytes'])}")
    agreement = report.get("agreement")
    if agreement is None:
        print("agreement with the float model: not measured (pass --data IMAGES to measure it)")
    else:
        line = f"on {agreement['images']} images of {agreement['data']}: max |diff| {agreement['max_abs_diff']:.2g}"
        if "top1_agreement" in agreement:
            line += f", top-1 agreement {agreement['top1_agreement']:.2%}"
        if "accuracy" in agreement:
            accuracy = agreement["accuracy"]
            line += f", accuracy {accuracy['float']:.2%} float -> {accuracy['quantized']:.2%} {mode}"
        for key, share in agreement.get("equal", {}).items():
            line += f", {key} {share:.2%} the same"
        if "min_cosine" in agreement:
            line += f", embeddings' cosine >= {agreement['min_cosine']:.4f}"
        print(line)
    print(f"wrote {out} (model.keras, {REPORT_FILE}): predict, evaluate, inspect and export read it as a run folder")


def _mb(n):
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.1f} KB"
