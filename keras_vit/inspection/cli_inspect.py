"""`keras-vit inspect MODEL --image IMG... --out DIR`: attention maps and the paper's figures.

Writes rollout.png, attention_heads.png, embedding_filters.png,
position_similarity.png and attention_distance.png (see
`keras_vit.inspection.make_figures`). The mean attention distance is averaged
over every image given; the overlays show --overlays of them, drawn round the
classes when the images say theirs (a folder of class sub-folders, read with
--recursive, as training reads one; or a file whose folder is named after one
of the model's labels), each captioned with its file, true class and
prediction, at its own aspect ratio. --max-images draws round the classes too.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from keras_vit.utils import storage
from keras_vit.utils.flags import UsageError, image_size, positive_int
from keras_vit.inspection.cli_predict import MODEL_HELP


def add_arguments(parser):
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--image", "--images", dest="images", action="append", required=True, metavar="PATH",
                        help="an image file or a folder of images; repeat for more")
    parser.add_argument("--out", default="figures", help="output folder (default figures/)")
    parser.add_argument("--labels", help="class names for the captions: a text file or JSON list; "
                                         "default: the model's own, else the workdir's labels.txt, else class "
                                         "indices")
    parser.add_argument("--overlays", type=positive_int, default=4,
                        help="images shown in rollout.png, one per class first when classes are known (default 4)")
    parser.add_argument("--max-images", type=positive_int, default=None,
                        help="use at most this many images, drawn round the classes (default all)")
    parser.add_argument("--recursive", action="store_true", help="also read images in sub-folders")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="images per forward pass (default 16)")
    parser.add_argument("--dpi", type=positive_int, default=100, help="resolution of the PNGs (default 100)")
    parser.add_argument("--image-size", type=image_size,
                        help="inspect at this size, SIDE or HEIGHT,WIDTH: the model is rebuilt at it (position "
                             "weights resized), so every figure has that grid")


def _dense_figure(task, model, pixels, paths, args):
    """outputs.png: each image beside its segmentation or depth (Task.figure_panels)."""
    import numpy as np

    from keras_vit.inspection.plots import plot_panels

    outputs = {k: np.asarray(v) for k, v in task.serve(model, pixels).items()}
    rows = [[(os.path.basename(path), np.round(pixels[i]).astype(np.uint8))]
            + task.figure_panels(pixels[i], {k: v[i] for k, v in outputs.items()}) for i, path in enumerate(paths)]
    return plot_panels(rows, os.path.join(args.out, "outputs.png"), args.dpi)


def run(args):
    from keras_vit.images import find_images, load_images
    from keras_vit.inspection.figures import choose_overlays, make_figures
    from keras_vit.inspection.predict import folders_without_images, nothing_read
    from keras_vit.inspection.plots import require_matplotlib
    from keras_vit.model import PatchGridModel
    from keras_vit.runs.source import open_model, resized

    require_matplotlib()  # before anything is read or any folder made
    unwritable = storage.unwritable(args.out)
    if unwritable is not None:  # found before the model is loaded, not after the figures are drawn
        raise UsageError(f"--out {args.out!r} cannot be written ({unwritable}): give a folder this user can write.")
    source = open_model(args.model, args.labels)
    dense = None
    if isinstance(source.model, PatchGridModel):  # a run of a Task with its own head: its encoder's figures
        from keras_vit.tasks import run_task

        task = run_task(args.model)
        if hasattr(task, "figure_panels"):  # segmentation, depth: their outputs over the images, too
            dense = (task, source.model)
        else:
            print(f"keras-vit inspect: {args.model} is a run of a Task with its own head: the figures are its "
                  f"ViT's (attention, tokens); the head is not drawn.", flush=True)
        source = dataclasses.replace(source, model=source.model.vit)
    if getattr(source.model, "dynamic_image_size", False) or args.image_size is not None:
        # Figures read one grid: a fixed model at the size asked (or the one a dynamic model was built for).
        source = resized(source, args.image_size)
        fixed = source.model.with_image_size(dynamic_image_size=False, dynamic_image_pad=False)
        source = dataclasses.replace(source, model=fixed)
    model, labels = source.model, source.labels
    files = find_images(args.images, recursive=args.recursive)
    classes = true_classes(files, args.images, labels)
    if args.max_images is not None:
        kept = sorted(choose_overlays(len(files), args.max_images, classes))
        files, classes = [files[i] for i in kept], [classes[i] for i in kept]
    pixels, read, failures = load_images(files, model.image_size, model.num_channels)
    failures = folders_without_images(args.images, args.recursive) + failures
    if not read:
        raise UsageError(nothing_read(failures))
    for path, reason in failures:
        print(f"keras-vit inspect: skipped {path}: {reason}", file=sys.stderr)
    class_of = dict(zip(files, classes))
    classes = [class_of[path] for path in read]
    paths = make_figures(model, pixels, args.out, labels=labels, num_overlays=args.overlays,
                         batch_size=args.batch_size, dpi=args.dpi, paths=read, classes=classes)
    if dense is not None:
        paths["outputs"] = _dense_figure(*dense, pixels[:args.overlays], read, args)
    if hasattr(model, "input_description"):
        print(f"{source.description}: inputs: {model.input_description}")
    named = {c for c in classes if c is not None}
    shown = ", ".join(os.path.basename(read[i]) + ("" if classes[i] is None else f" ({classes[i]})")
                      for i in choose_overlays(len(read), args.overlays, classes))
    print(f"{len(read)} image(s)" + (f" of {len(named)} classes" if named else "") + f"; rollout.png shows {shown}")
    for name, path in paths.items():
        print(f"  {name:20} {path}")
    if model.resnet is not None:
        print("  (no embedding_filters.png: a hybrid's patch embedding filters ResNet features, not pixels)")
    return 0


def true_classes(files, given, labels=None):
    """The true class of each file, or None where it cannot be told: the
    sub-folder it lies in under a folder given (`<folder>/<class>/.../<file>`,
    the layout training reads), else its own folder's name when that is one
    of the model's `labels`."""
    folders = [os.path.abspath(g) for g in given if os.path.isdir(g)]
    names = set(labels or ())
    classes = []
    for file in files:
        path = os.path.abspath(file)
        found = None
        for folder in folders:
            relative = os.path.relpath(path, folder)
            parts = relative.split(os.sep)
            if not relative.startswith(os.pardir) and len(parts) > 1:
                found = parts[0]
                break
        if found is None and os.path.basename(os.path.dirname(path)) in names:
            found = os.path.basename(os.path.dirname(path))
        classes.append(found)
    return classes
