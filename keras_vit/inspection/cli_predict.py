"""`keras-vit predict MODEL IMAGE... [--top K]`: top-k labels for image files or folders.

Unreadable files, and folders giving no image, are reported on stderr by name
and skipped. Exit status: 0 when every image was predicted; 1 when some
inputs failed (the others are printed, then a line says how many failed, so
a script cannot miss it); 2, with one error line saying why for each input,
when none could be read.
"""

from __future__ import annotations

import json

from keras_vit.utils.flags import UsageError, image_size, positive_int

MODEL_HELP = ("a training workdir, a .keras file, or anything keras_vit.from_pretrained takes (an HF transformers, "
              "keras-hub or timm folder, hf:ORG/NAME, kerashub:PRESET, imagenet21k+imagenet2012:B/16, ...)")


def add_arguments(parser):
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("images", nargs="+", help="image files and/or folders of images")
    parser.add_argument("--top", type=positive_int, default=5, help="classes to show per image (default 5)")
    parser.add_argument("--labels", help="class names: a text file (one per line) or JSON list; "
                                         "default: the model's own, else the workdir's labels.txt, else class "
                                         "indices")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per step (default 32)")
    parser.add_argument("--recursive", action="store_true", help="also read images in sub-folders")
    parser.add_argument("--json", action="store_true", help="print one JSON object per image instead of a table")
    parser.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    parser.add_argument("--out", metavar="DIR",
                        help="a segmentation or depth run: write each image's outputs here at the image's own size, "
                             "named after it (NAME_mask.png of class ids and NAME_colour.png; NAME_depth.png in "
                             "millimetres and NAME_depth_colour.png)")
    add_size_arguments(parser)
    add_budget_argument(parser)


def add_budget_argument(parser):
    """--max-num-patches (predict and evaluate): a NaFlex model's patch budget per image."""
    parser.add_argument("--max-num-patches", type=positive_int,
                        help="NaFlex (SigLIP2) models: each image is read at its own aspect ratio within this many "
                             "patches, as transformers' Siglip2ImageProcessor(max_num_patches=N) (256 to 1024 in "
                             "use; default: the position table's, e.g. 256); the table is resized to each "
                             "image's grid, no rebuild")


def add_size_arguments(parser):
    """--image-size and --dynamic-image-size (predict and inspect)."""
    parser.add_argument("--image-size", type=image_size,
                        help="run at this size, SIDE or HEIGHT,WIDTH (images resized to it): the model is rebuilt "
                             "at it (position weights resized), or with --dynamic-image-size runs there as it is")
    parser.add_argument("--dynamic-image-size", action="store_true",
                        help="one model for any size: the position embedding is interpolated in the graph "
                             "(the same answers as a model rebuilt at the size)")


def open_sized(args):
    """The command's model at --image-size / --dynamic-image-size, and the size images are read at."""
    from keras_vit.runs.source import open_model, resized

    source = open_model(args.model, args.labels)
    if args.dynamic_image_size or getattr(source.model, "dynamic_image_size", False):
        return resized(source, dynamic_image_size=True), args.image_size
    return resized(source, args.image_size), None


def run(args):
    from keras_vit.inspection.predict import (folders_without_images, nothing_read, predict_files, predict_task,
                                              report_skipped)
    from keras_vit.tasks import run_task

    task = run_task(args.model)
    if args.out and not hasattr(task, "write_outputs"):
        raise UsageError(f"--out writes the per-pixel outputs of a segmentation or depth run; {args.model} is "
                         f"{'a ' + task.name + ' run' if task else 'a classifier'}: drop --out.")
    if task is not None:  # a run of a Task whose model is not a classifier: its outputs, in its words
        predictions, failures = predict_task(args.model, task, args.images, batch_size=args.batch_size,
                                             recursive=args.recursive)
        show = _task_lines(task, args.json) if not args.out else _written(task, args.out)
    else:
        source, size = open_sized(args)
        predictions, failures = predict_files(
            source.model, args.images, top_k=args.top, labels=source.labels, batch_size=args.batch_size,
            recursive=args.recursive, progress=False if args.no_progress else None, image_size=size,
            max_num_patches=args.max_num_patches,
        )
        show = _class_lines(args.json)
    failures = folders_without_images(args.images, args.recursive) + failures
    if not predictions:
        raise UsageError(nothing_read(failures))
    for prediction in predictions:
        show(prediction)
    return report_skipped("predict", failures, len(predictions), "predicted")


def _class_lines(as_json):
    """A classifier's prediction: its top classes, a line each (or one JSON object)."""
    def show(prediction):
        if as_json:
            print(json.dumps(prediction.to_dict()))
            return
        print(prediction.path)
        for label, p in zip(prediction.labels, prediction.probabilities):
            print(f"  {p:7.4f}  {label}")

    return show


def _written(task, folder):
    """(path, outputs) of a dense Task's run: its files at the image's own size in `folder`, a line each."""
    import os

    os.makedirs(folder, exist_ok=True)

    def show(prediction):
        path, outputs, (height, width) = prediction  # the image's own size, upright as its EXIF says
        stem = os.path.join(folder, os.path.splitext(os.path.basename(path))[0])
        written = task.write_outputs(outputs, stem, height, width)
        print(f"{path}\n  {task.describe_outputs(outputs)}\n  -> {', '.join(written)} ({width}x{height})")

    return show


def _task_lines(task, as_json):
    """(path, outputs) of a Task's run: Task.describe_outputs' line (or the arrays as JSON)."""
    import numpy as np

    def show(prediction):
        path, outputs, _ = prediction
        if as_json:
            print(json.dumps({"path": path, **{k: np.asarray(v).tolist() for k, v in outputs.items()}}))
        else:
            print(f"{path}\n  {task.describe_outputs(outputs)}")

    return show
