"""`keras-vit predict MODEL IMAGE... [--top K]`: top-k labels for image files or folders.

Unreadable files are reported on stderr by name and skipped. Exit status: 0
when at least one image was predicted, 1 when none could be read.
"""

from __future__ import annotations

import json
import sys

from keras_vit.cli import positive_int


def add_arguments(parser):
    parser.add_argument("model", help="a .keras file, or a training workdir holding model.keras")
    parser.add_argument("images", nargs="+", help="image files and/or folders of images")
    parser.add_argument("--top", type=positive_int, default=5, help="classes to show per image (default 5)")
    parser.add_argument("--labels", help="class names: a text file (one per line) or JSON list; "
                                         "default: the workdir's labels.txt, else class indices")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per step (default 32)")
    parser.add_argument("--recursive", action="store_true", help="also read images in sub-folders")
    parser.add_argument("--json", action="store_true", help="print one JSON object per image instead of a table")
    parser.add_argument("--no-progress", action="store_true", help="never show the progress bar")


def run(args):
    from keras_vit.inspection.predict import find_labels, load_model, predict_files

    model = load_model(args.model)
    labels = find_labels(args.model, args.labels)
    predictions, failures = predict_files(
        model, args.images, top_k=args.top, labels=labels, batch_size=args.batch_size,
        recursive=args.recursive, progress=False if args.no_progress else None,
    )
    for prediction in predictions:
        if args.json:
            print(json.dumps(prediction.to_dict()))
            continue
        print(prediction.path)
        for label, p in zip(prediction.labels, prediction.probabilities):
            print(f"  {p:7.4f}  {label}")
    for path, reason in failures:
        print(f"keras-vit predict: skipped {path}: {reason}", file=sys.stderr)
    if not predictions:
        print("keras-vit predict: no image could be read.", file=sys.stderr)
        return 1
    return 0
