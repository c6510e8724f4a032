"""`keras-vit export`: SavedModel / TFLite / ONNX, each validated against Keras.

    keras-vit export runs/demo --formats saved_model,tflite,tflite-fp16,tflite-int8,onnx \\
        --out exports/demo --data mnist
"""

from __future__ import annotations

import sys


def add_arguments(parser):
    # The registry imports no TensorFlow: --help stays fast.
    from keras_vit.utils.flags import image_size, positive_int
    from keras_vit.errors import install_hint
    from keras_vit.export.registry import FORMATS, OPTIONAL_FORMATS, REGISTRY

    needing = {}
    for name, fmt in REGISTRY.items():
        if fmt.default and fmt.extra:
            needing.setdefault(fmt.extra, []).append(name)
    extras = "; ".join(f"{','.join(names)} need {install_hint(extra)}" for extra, names in needing.items())

    parser.add_argument("source", help="a training workdir, a .keras file, anything keras_vit.from_pretrained "
                                       "takes (an HF transformers, keras-hub or timm folder, hf:ORG/NAME, "
                                       "kerashub:PRESET, imagenet21k:B/16, ...), or a variant name such as B/16 "
                                       "(then --weights is required)")
    parser.add_argument("--formats",
                        help=f"comma-separated, out of {','.join(FORMATS + OPTIONAL_FORMATS)} (default: "
                             f"{','.join(FORMATS)}, less those whose packages are not installed: {extras})")
    parser.add_argument("--out", default="exports", help="output folder, holding this export only (default: "
                                                         "exports)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the export already in --out, as a whole, once the new one passed")
    parser.add_argument("--name", help="artifact name (default: the workdir, file or checkpoint name)")
    parser.add_argument("--version", type=int, help="SavedModel version (default: 1, or one above the export "
                                                    "replaced, so that TF Serving loads it)")
    parser.add_argument("--labels", help="class names, one per line (default: the model's own, else the "
                                         "workdir's, else 0..N-1)")
    parser.add_argument("--data", help="validation (and calibration) images: 'mnist' (the 1,000 held-out test "
                                       "digits of the bundled 5,000), an .npz with images[/labels], a .npy, or a "
                                       "folder (class sub-folders give labels). Default: random pixels (no "
                                       "accuracy; int8 refuses)")
    parser.add_argument("--calibration-data", help="int8 calibration images (same forms); default: "
                                                   "--num-calibration images of --data drawn across classes "
                                                   "(seeded), kept out of validation")
    parser.add_argument("--num-calibration", type=int, default=200, help="int8 calibration images (default 200)")
    parser.add_argument("--num-validation", type=int, default=1000,
                        help="validation images at most, a seeded sample across classes (default 1000)")
    parser.add_argument("--top-k", type=int, default=5, help="classes returned by the SavedModel (default 5)")
    parser.add_argument("--latency-runs", type=int, default=20, help="timed single-image calls (default 20)")
    image_text = parser.add_argument_group("an image-text model (SigLIP, SigLIP2, CLIP, MetaCLIP 2)")
    image_text.add_argument("--tower", choices=("image", "text"),
                            help="image (default for such a folder): a zero-shot classifier of --labels a,b,c, "
                                 "formats saved_model and tflite; text: the text tower (token ids in, "
                                 "embeddings out), saved_model")
    image_text.add_argument("--template", action="append", default=None,
                            help="a prompt holding the label as {}; repeat it for an ensemble")
    group = parser.add_argument_group("building a variant (source is a variant name)")
    group.add_argument("--weights", help="an official-format .npz or a checkpoint name")
    parser.add_argument("--image-size", type=image_size,
                        help="input size, SIDE or HEIGHT,WIDTH: a variant is built at it (default 224), any other "
                             "ViT rebuilt at it (position weights resized); every fixed-size artifact takes it")
    parser.add_argument("--dynamic-image-size", action="store_true",
                        help="the SavedModel, ONNX and TFLite artifacts take any height and width (multiples of the "
                             "patch size; the position embedding is interpolated in the graph); validated at the "
                             "model's size")
    parser.add_argument("--max-num-patches", type=positive_int,
                        help="NaFlex (SigLIP2) models: serving_bytes reads each image at its own aspect ratio within "
                             "this many patches, as transformers' Siglip2ImageProcessor(max_num_patches=N) (default: "
                             "the position table's); recorded in report.json")
    group.add_argument("--num-classes", type=int, help="classes of the head (default 1000)")
    group.add_argument("--num-channels", type=int, help="input channels (default 3)")
    parser.add_argument("--quiet", action="store_true", help="print only the table")


def run(args):
    from keras_vit.errors import CannotContinue, UserError
    from keras_vit.export.pipeline import export

    # One source for both (no --calibration-data): export() calibrates on a
    # sample across classes and validates on the other images.
    validation, calibration = args.data, args.calibration_data
    if args.tower or args.template or _is_image_text(args.source):
        return _image_text(args)
    try:
        report = export(
            args.source, args.formats, args.out, validation_data=validation, calibration_data=calibration,
            labels=args.labels, name=args.name, version=args.version, top_k=args.top_k,
            num_validation=args.num_validation, num_calibration=args.num_calibration,
            latency_runs=args.latency_runs, weights=args.weights, image_size=args.image_size,
            num_classes=args.num_classes, num_channels=args.num_channels, overwrite=args.overwrite, verbose=not args.quiet,
            dynamic_image_size=args.dynamic_image_size, max_num_patches=args.max_num_patches)
    except UserError as error:  # bad input, or a missing extra (ExportError, MissingExtra)
        print(f"keras-vit export: error: {error}", file=sys.stderr)
        return 2
    except CannotContinue as error:  # an artifact failed its validation (ExportFailed)
        print(f"keras-vit export: {error}", file=sys.stderr)
        return 1
    if args.quiet and "task" in report:  # a Task run's SavedModel: its one line
        from keras_vit.export.task_export import summary_line

        print(summary_line(report))
    elif args.quiet:  # export() printed nothing: the table alone
        from keras_vit.export.report import print_table

        print_table(report)
    return 0 if report["passed"] else 1



def _is_image_text(source) -> bool:
    """A folder holding both towers of a SigLIP, SigLIP2, CLIP or MetaCLIP 2 checkpoint, or a run of
    the image-text Task (--recipe siglip or clip)."""
    import json
    import os

    from keras_vit.weights.hf_text import FAMILIES

    config = os.path.join(str(source), "config.json")
    try:
        with open(config, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError):
        return False
    plan = settings.get("plan")
    return settings.get("model_type") in FAMILIES or (isinstance(plan, dict) and plan.get("task") == "image_text")


def _image_text(args) -> int:
    import os

    from keras_vit.errors import CannotContinue, UserError
    from keras_vit.export.image_text_export import export_image_text

    labels = args.labels
    if labels is not None:
        if os.path.isfile(labels):
            from keras_vit.utils import storage

            labels = storage.read_lines(labels)
        else:
            labels = labels.split(",")
    try:
        report = export_image_text(args.source, labels, args.formats, args.out, templates=args.template,
                                   tower=args.tower or "image", name=args.name, version=args.version,
                                   overwrite=args.overwrite, validation_data=args.data, verbose=True)
    except UserError as error:
        print(f"keras-vit export: error: {error}", file=sys.stderr)
        return 2
    except CannotContinue as error:
        print(f"keras-vit export: {error}", file=sys.stderr)
        return 1
    return 0 if report["passed"] else 1
