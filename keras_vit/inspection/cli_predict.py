"""`keras-vit predict MODEL IMAGE... [--top K]`: top-k labels for image files or folders.

Unreadable files, and folders giving no image, are reported on stderr by name
and skipped. Exit status: 0 when at least one image was predicted; 2, with
one error line saying why for each input, when none could be read.
"""

from __future__ import annotations

import json
import sys

from keras_vit._flags import UsageError, positive_int

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


def run(args):
    from keras_vit.inspection.predict import folders_without_images, nothing_read, predict_files
    from keras_vit.model_source import open_model

    source = open_model(args.model, args.labels)
    predictions, failures = predict_files(
        source.model, args.images, top_k=args.top, labels=source.labels, batch_size=args.batch_size,
        recursive=args.recursive, progress=False if args.no_progress else None,
    )
    failures = folders_without_images(args.images, args.recursive) + failures
    if not predictions:
        raise UsageError(nothing_read(failures))
    for prediction in predictions:
        if args.json:
            print(json.dumps(prediction.to_dict()))
            continue
        print(prediction.path)
        for label, p in zip(prediction.labels, prediction.probabilities):
            print(f"  {p:7.4f}  {label}")
    for path, reason in failures:
        print(f"keras-vit predict: skipped {path}: {reason}", file=sys.stderr)
    return 0
