"""`make demo` / `keras-vit demo`: the whole product on a 2-core CPU in minutes.

Trains a micro ViT (Mu/4 sizes on 7x7 patches) from scratch on the 5,000 MNIST digits that
ship inside this package (keras_vit/data/mnist5k.npz; 4,000 train, 1,000 held out), then exports it to
SavedModel and TFLite (float32, float16, int8) and validates every artifact
on the held-out digits. Re-running resumes the training from its checkpoint.
"""

from __future__ import annotations

import json
import os

from keras_vit.utils.flags import non_negative_int

DEFAULT_FORMATS = "saved_model,tflite,tflite-fp16,tflite-dynamic,tflite-int8"


def add_arguments(parser):
    parser.add_argument("--workdir", default="runs/demo", help="training workdir (default: runs/demo)")
    parser.add_argument("--out", default="exports/demo", help="export folder (default: exports/demo)")
    parser.add_argument("--steps", type=non_negative_int, default=None, help="optimizer steps (default: the demo recipe's)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="initialisation, shuffling and augmentation seed (default: 0)")
    parser.add_argument("--formats", default=DEFAULT_FORMATS, help=f"export formats (default: {DEFAULT_FORMATS})")
    parser.add_argument("--no-export", action="store_true", help="train only")


def run(args):
    from keras_vit import training

    if not args.no_export:  # before minutes of training, not after them
        from keras_vit.export import install

        install.check_out(args.out, overwrite=True)  # the demo's own folder: a re-run replaces its export
    overrides = {"seed": args.seed}
    if args.steps is not None:
        overrides["steps"] = args.steps
    config = training.demo_config(workdir=args.workdir, **overrides)
    print(f"== Training {config.model} ({config.recipe.name} recipe) on the bundled MNIST digits -> {args.workdir}")
    results = training.train(config)
    accuracy = results["eval"]["accuracy"]
    print(f"== Test accuracy on the 1,000 held-out digits: {accuracy:.2%} "
          f"({results['steps']} steps, {results['wall_time_s']:.0f} s)")
    if args.no_export:
        return 0

    from keras_vit import export
    from keras_vit.data import mnist5k

    (train_images, train_labels), (test_images, test_labels) = mnist5k.split()
    print(f"== Exporting {args.workdir}/model.keras -> {args.out}, validated on the held-out digits")
    report = export.export(args.workdir, args.formats, args.out,
                           validation_data=(test_images.astype("float32"), test_labels),
                           # int8 calibration must not see the validation images.
                           calibration_data=(train_images[:200].astype("float32"), train_labels[:200]),
                           overwrite=True,  # the demo's own folder: a re-run replaces its export
                           raise_on_failure=False)  # prints the table
    with open(os.path.join(args.workdir, "demo.json"), "w") as f:
        json.dump({"test_accuracy": accuracy, "export_report": os.path.join(args.out, "report.json")}, f, indent=2)
    return 0 if report["passed"] else 1

