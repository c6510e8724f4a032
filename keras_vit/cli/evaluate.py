"""`keras-vit evaluate MODEL DATA`: a classifier's accuracy on labelled images.

    keras-vit evaluate runs/photos photos/

MODEL is anything predict takes (a run folder, a LoRA or quantised run, a
.keras file, a checkpoint); DATA a folder of class sub-folders, 'mnist' (the
1,000 digits no run trains on) or an .npz with labels. Images are decoded
and resized to the model's size as predict reads them (a NaFlex model, SigLIP2's: each image
at its own aspect ratio within --max-num-patches, in padded batches). A folder's classes
are matched to the model's by name (by position where the model has no
names), so a folder holding some of the model's classes is measured on them.

A run of a Task whose model is not a classifier (keras_vit.tasks: a mask per
pixel, ...) is measured by that Task: DATA is data as `keras-vit train` takes it
with the Task's fields (a list: CSV, or the path of one, every row measured),
decoded and resized as the run's evaluation was, and the figures are the
Task's own (Task.summarize), printed in its words (Task.describe).
"""

from __future__ import annotations

import json
from typing import List, Optional

import numpy as np

from keras_vit.utils.flags import positive_int


def add_arguments(parser):
    from keras_vit.inspection.cli_predict import MODEL_HELP, add_budget_argument, add_size_arguments

    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("data", help="labelled images: a folder of class sub-folders, 'mnist', or an .npz with "
                                     "'images' and 'labels'; for a run of another Task (a mask per pixel, ...), "
                                     "data as train takes it with the Task's columns (a list: CSV, every row)")
    parser.add_argument("--num-images", type=positive_int,
                        help="at most this many images, a seeded sample across classes (default: all)")
    parser.add_argument("--labels", help="the model's class names, one per line (default: its own, else its run's)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per step (default 64)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--zero-shot", action="store_true",
                        help="MODEL is an image-text model (SigLIP, CLIP, ...): classify into the data's class "
                             "names (its folders', the digits' 'zero'..'nine', or --labels) written as texts")
    parser.add_argument("--template", action="append", default=None,
                        help="with --zero-shot: a prompt holding the class name as {}, e.g. 'a photo of a {}.'; "
                             "repeat it for an ensemble")
    add_size_arguments(parser)
    add_budget_argument(parser)


def run(args):
    from keras_vit.errors import UserError
    from keras_vit.inspection.cli_predict import open_sized
    from keras_vit.inspection.predict import naflex_sizing

    from keras_vit.tasks import run_task

    if args.zero_shot:
        return _zero_shot(args)
    if args.template:
        raise UserError("--template words the class names of --zero-shot: give --zero-shot with it.")
    task = run_task(args.model)
    if task is not None:
        return _task_run(args, task)
    _check_data_exists(args.data)  # before the model loads
    source, size = open_sized(args)
    model = source.model
    if not getattr(model, "include_top", False):
        raise UserError(f"{args.model} has no classification head (include_top=False): evaluate measures a "
                        f"classifier; give a run or checkpoint with its head.")
    own_sizes = naflex_sizing(model, size, args.max_num_patches)  # NaFlex: each image as predict reads it
    names = _class_names(args.data)
    probabilities, labels = [], []
    measured = _naflex_chunks(args, model) if own_sizes else _fixed_size_chunks(args, model, size)
    for chunk_probabilities, chunk_labels in measured:
        if chunk_labels is None:
            raise UserError(f"{args.data} has no labels: give a folder of class sub-folders, 'mnist', or an .npz "
                            f"with a 'labels' array.")
        labels.append(_model_ids(chunk_labels, names, source.labels, model.num_classes, args.data))
        probabilities.append(chunk_probabilities)
    if not labels:  # every file of the data failed to decode (each named in a warning)
        raise UserError(f"None of the images of {args.data} could be read.")
    figures = _figures(np.concatenate(probabilities), np.concatenate(labels), source.labels)
    figures = {"model": str(args.model), "data": str(args.data), **figures}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _print(figures, source.description)
    return 0


# The digits' class names as words: what an image-text model was trained to read.
DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _zero_shot(args) -> int:
    """An image-text model's zero-shot top-1/top-5 on labelled data, the classes named by the data."""
    from keras_vit.errors import UserError
    from keras_vit.model.pretrained import from_pretrained
    from keras_vit.model.processor import read_processor

    _check_data_exists(args.data)
    if args.labels:
        from keras_vit.utils import storage

        names = storage.read_lines(args.labels)
    else:
        names = DIGIT_WORDS if str(args.data).lower() == "mnist" else _class_names(args.data)
    if names is None:
        raise UserError(f"{args.data} names no classes: --zero-shot reads them from a folder of class sub-folders "
                        f"or 'mnist', or give them with --labels FILE (one per line, in label order).")
    model = from_pretrained(args.model, task="image_text")
    processor = read_processor(model)
    label_embeddings = model.label_embeddings(names, args.template)
    probabilities, labels = [], []
    for inputs, chunk_labels in _zero_shot_chunks(args, processor):
        logits = model.logits_of_embeddings(model.image_embeddings(inputs, args.batch_size), label_embeddings)
        probabilities.append(model.probabilities(logits))
        labels.append(np.asarray(chunk_labels, np.int64))
    if not labels:
        raise UserError(f"None of the images of {args.data} could be read.")
    labels = np.concatenate(labels)
    if labels.max() >= len(names):
        raise UserError(f"{args.data} has labels up to {labels.max()}, and {len(names)} class names: give one name "
                        f"per class with --labels.")
    figures = {"model": str(args.model), "data": str(args.data), "zero_shot": True,
               **_figures(np.concatenate(probabilities), labels, names)}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _print(figures, f"{model.family} zero-shot")
    return 0


def _zero_shot_chunks(args, processor, chunk_size: int = 256):
    """(tower inputs, labels) a chunk at a time, each image read as the checkpoint's processor reads it."""
    from keras_vit.errors import UserError
    from keras_vit.export import data as data_lib
    from keras_vit.utils import console, storage

    spec = str(args.data)
    if spec.lower() != "mnist" and storage.isdir(spec):
        entries = data_lib.sampled_entries(spec, args.num_images)
        for start in range(0, len(entries), chunk_size):
            label_of = dict(entries[start:start + chunk_size])
            inputs, read, failed = processor.read(list(label_of))
            if failed:
                console.warn(f"{len(failed)} unreadable image(s) under {spec} left out: "
                             + "; ".join(f"{path} ({why})" for path, why in failed))
            if read:
                yield inputs, [label_of[path] for path in read]
        return
    data = data_lib.sample(data_lib.read(spec), args.num_images)
    if data.labels is None:
        raise UserError(f"{spec} has no labels: give a folder of class sub-folders, 'mnist', or an .npz with a "
                        f"'labels' array.")
    for start in range(0, len(data), chunk_size):
        chunk = data.take(start, start + chunk_size)
        yield processor.inputs(list(chunk.images)), chunk.labels


def _task_run(args, task) -> int:
    """Evaluates a run of a Task that is not a classifier on DATA with the run's own plan of
    decoding and resizing; prints the Task's figures."""
    import dataclasses

    import tensorflow as tf

    from keras_vit import runs
    from keras_vit.config import ViTConfig
    from keras_vit.errors import UserError
    from keras_vit.training import TrainConfig, data as data_lib, plan as plan_lib

    workdir = runs.workdir_of(args.model)
    settings = runs.read_config(workdir)
    run_plan = settings.pop("plan")
    config = TrainConfig.from_dict(settings).replace(  # the run's size and classes, whatever the data's
        dataset=_whole_data(args.data), eval_batch_size=args.batch_size, progress=False,
        image_size=tuple(run_plan["image_size"]), num_classes=int(run_plan["num_classes"]),
        precision=run_plan.get("precision", "float32"))
    source = data_lib.open_source(config, fields=task.fields)
    plan = plan_lib.resolve(config, source, task=task, model=ViTConfig.from_dict(run_plan["model"]))
    plan = dataclasses.replace(plan, num_channels=int(run_plan["num_channels"]))
    model = runs.load_model(workdir)
    batches = data_lib.eval_dataset(source, plan, plan.eval_steps, tf.distribute.InputContext())
    sums = tf.function(lambda batch: task.weighted_sums(model, batch), autograph=False)
    totals = {}
    for batch in batches:
        for name, value in sums(batch).items():
            totals[name] = totals.get(name, 0.0) + float(value)
    if not totals.get("count"):
        raise UserError(f"None of the examples of {args.data} could be read.")
    summary = task.summarize(totals)
    if args.json:
        print(json.dumps({"model": str(args.model), "data": str(args.data), "task": task.name, **summary}, indent=2))
    else:
        print(f"{workdir} ({task.name}) on {summary['num_examples']} examples of {args.data}: {task.describe(summary)}")
        if hasattr(task, "describe_classes"):  # segmentation: each class's IoU, by the data's names
            print("\n".join(task.describe_classes(summary, source.class_names)))
    return 0


def _whole_data(spec: str) -> str:
    """DATA as a dataset whose evaluation split is all of it: a list file (list:FILE, or FILE.csv)
    is its own evaluation split (list:FILE,FILE), as a masks: or depth: folder is (its val/ where
    it is split); any other spec as train takes it."""
    spec = str(spec)
    if spec.startswith(("masks:", "depth:")) and "," not in spec:
        return f"{spec},{spec.partition(':')[2]}"
    if spec.startswith("list:") and "," not in spec:
        spec = spec[len("list:"):]
    if spec.lower().endswith((".csv", ".json")):
        return f"list:{spec},{spec}"
    return spec


def _check_data_exists(spec) -> None:
    """A DATA path that is not there is bad input (exit 2), said before the model loads."""
    from keras_vit.errors import UserError
    from keras_vit.utils import storage

    if str(spec).lower() != "mnist" and not storage.exists(str(spec)):
        raise UserError(f"DATA {spec} does not exist: give a folder of class sub-folders, 'mnist', or an .npz "
                        f"with 'images' and 'labels'.")


def _fixed_size_chunks(args, model, size):
    """(probabilities, labels) a chunk at a time, every image resized to `size` (None: the model's):
    a folder of any size is decoded as it is measured."""
    from keras_vit.export import data as data_lib
    from keras_vit.export.serving import input_size, keras_probabilities, traced_probabilities

    height, width, channels = input_size(model)
    traced = traced_probabilities(model)  # one trace for every chunk
    for chunk in data_lib.chunks(args.data, size or (height, width), channels, args.num_images):
        yield keras_probabilities(model, chunk.images, args.batch_size, traced=traced), chunk.labels


def _naflex_chunks(args, model, chunk_size: int = 256):
    """(probabilities, labels) a chunk at a time for a NaFlex model: each image at its own size
    within --max-num-patches, as `keras-vit predict` reads it (files by keras_vit.images.load_images,
    arrays image by image), run in padded batches (keras_vit.model.naflex.outputs_naflex)."""
    from keras_vit import images as images_lib
    from keras_vit.export import data as data_lib
    from keras_vit.inspection.predict import to_probabilities
    from keras_vit.model.naflex import outputs_naflex, size_rule
    from keras_vit.utils import console, storage

    rule, channels, budget = size_rule(model, args.max_num_patches), model.num_channels, args.max_num_patches
    spec = str(args.data)
    if spec.lower() != "mnist" and storage.isdir(spec):
        entries = data_lib.sampled_entries(spec, args.num_images)
        for start in range(0, len(entries), chunk_size):
            label_of = dict(entries[start:start + chunk_size])
            pixels, read, failed = images_lib.load_images(list(label_of), rule, channels)
            if failed:
                console.warn(f"{len(failed)} unreadable image(s) under {spec} left out: "
                             + "; ".join(f"{path} ({why})" for path, why in failed))
            if read:
                labels = None if entries[0][1] is None else np.array([label_of[path] for path in read])
                yield to_probabilities(model, outputs_naflex(model, pixels, args.batch_size, budget)), labels
        return
    data = data_lib.sample(data_lib.read(spec), args.num_images)
    for start in range(0, len(data), chunk_size):
        chunk = data.take(start, start + chunk_size)
        pixels = [images_lib.fit_pixels(image, rule, channels) for image in chunk.images]
        yield to_probabilities(model, outputs_naflex(model, pixels, args.batch_size, budget)), chunk.labels


def _class_names(spec) -> Optional[List[str]]:
    """The data's class names by label id: a folder's class sub-folders (sorted), the digits'
    "0".."9"; None for arrays."""
    from keras_vit import images as images_lib
    from keras_vit.utils import storage

    if str(spec).lower() == "mnist":
        return [str(i) for i in range(10)]
    if storage.exists(str(spec)) and storage.isdir(str(spec)):
        return images_lib.class_folders(str(spec))
    return None


def _model_ids(labels, names, model_names, num_classes: int, where) -> np.ndarray:
    """The data's labels as the model's class ids: by name where both have names (each name the
    model's once), else by position (the data's classes as many as the model's)."""
    from keras_vit.errors import UserError

    labels = np.asarray(labels, np.int64)
    if names is not None and model_names is not None:
        model_names = [str(name) for name in model_names]
        present = [names[label] for label in np.unique(labels)]
        unknown = [name for name in present if name not in model_names]
        twice = [name for name in present if model_names.count(name) > 1]
        if unknown:
            raise UserError(f"{where} has classes the model does not know: {', '.join(unknown[:5])} (the model's: "
                            f"{', '.join(model_names[:8])}{', ...' if len(model_names) > 8 else ''}): evaluate on "
                            f"folders named as the model's classes, or give its names with --labels.")
        if twice:
            raise UserError(f"{where}: the model has more than one class named {', '.join(twice[:5])}, so a folder "
                            f"of that name is no one class: give the classes unique names with --labels.")
        model_id = {label: model_names.index(names[label]) for label in np.unique(labels)}
        return np.array([model_id[label] for label in labels], np.int64)
    if names is not None and len(names) != num_classes:
        raise UserError(f"{where} has {len(names)} class folders and the model {num_classes} classes without "
                        f"names, so they cannot be matched: give the model's class names with --labels.")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise UserError(f"{where} has labels {labels.min()}..{labels.max()}, and the model {num_classes} classes "
                        f"(0..{num_classes - 1}): give data labelled for this model.")
    return labels


def _figures(probabilities: np.ndarray, labels: np.ndarray, model_names) -> dict:
    """Top-1 (and top-5, for more than 5 classes) accuracy, overall and per class present."""
    ranked = np.argsort(-probabilities, axis=1)
    top1 = ranked[:, 0] == labels
    figures = {"images": int(len(labels)), "classes": int(len(np.unique(labels))), "top1": float(top1.mean())}
    if probabilities.shape[1] > 5:
        figures["top5"] = float(np.any(ranked[:, :5] == labels[:, None], axis=1).mean())
    name = (lambda c: str(model_names[c])) if model_names is not None else str
    figures["per_class"] = {name(c): {"images": int(np.sum(labels == c)), "top1": float(top1[labels == c].mean())}
                            for c in np.unique(labels)}
    return figures


def _print(figures: dict, description: str) -> None:
    line = (f"{description} on {figures['images']} images of {figures['data']} ({figures['classes']} classes): "
            f"top-1 {figures['top1']:.2%}")
    if "top5" in figures:
        line += f", top-5 {figures['top5']:.2%}"
    print(line)
    width = max(len(name) for name in figures["per_class"])
    for name, per_class in figures["per_class"].items():
        print(f"  {name:<{width}}  {per_class['images']:>5} images  top-1 {per_class['top1']:.2%}")
