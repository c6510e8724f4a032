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
    # Checked by TrainConfig, as train's: the training package is not imported to build the parser.
    parser.add_argument("--precision", default="auto",
                        help="as keras-vit train's (default: auto, the machine's faster one; the docs show "
                             "float32's output)")
    parser.add_argument("--image-text", action="store_true",
                        help="instead: train a small SigLIP from scratch on the digits with captions in twelve "
                             "phrasings, then classify the 1,000 held-out digits zero-shot with a phrasing it never "
                             "saw (workdir default runs/demo-image-text)")


def run(args):
    if args.image_text:
        return image_text_demo(args)
    from keras_vit import training

    if not args.no_export:  # before minutes of training, not after them
        from keras_vit.export import install

        install.check_out(args.out, overwrite=True)  # the demo's own folder: a re-run replaces its export
    overrides = {"seed": args.seed, "precision": args.precision}
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



# The image-text demo: captions of the training digits in these phrasings; zero-shot on the held-out
# digits with HELD_OUT_PHRASING, which no caption uses.
DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PHRASINGS = ["the digit {}", "a handwritten {}", "number {}", "{}", "a picture of a {}", "an image of the number {}",
             "a scan of a handwritten {}", "this is a {}", "a small {} written in ink", "the number {} on paper",
             "a drawing of {}", "{} written by hand"]
HELD_OUT_PHRASING = "a photo of the number {}"


def write_digit_captions(folder, images, labels, seed=0):
    """PNGs of the digits and captions.csv pairing each with its class in a random phrasing."""
    import csv

    import numpy as np
    from PIL import Image

    os.makedirs(os.path.join(folder, "digits"), exist_ok=True)
    rng = np.random.default_rng(seed)
    with open(os.path.join(folder, "captions.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        for i, (image, label) in enumerate(zip(images, labels)):
            Image.fromarray(np.asarray(image).reshape(image.shape[0], image.shape[1])).save(
                os.path.join(folder, "digits", f"{i}.png"))
            writer.writerow([f"digits/{i}.png", PHRASINGS[rng.integers(len(PHRASINGS))].format(DIGIT_WORDS[label])])
    return os.path.join(folder, "captions.csv")


def image_text_demo(args) -> int:
    import time

    import numpy as np

    from keras_vit import training
    from keras_vit.data import mnist5k
    from keras_vit.model.pretrained import from_pretrained
    from keras_vit.model.processor import read_processor

    workdir = args.workdir if args.workdir != "runs/demo" else "runs/demo-image-text"
    (train_images, train_labels), (test_images, test_labels) = mnist5k.split()
    captions = write_digit_captions(os.path.join(workdir + "-data"), train_images, train_labels, args.seed)
    # The classification demo's micro ViT (Mu/4 on 7x7 patches), augmentation (affine) and weight decay:
    # without augmentation (4x4 patches, wd 1e-4, 1,200 steps) the towers learned the 4,000 digits by
    # heart, 65.8% zero-shot; with these, 96.6% at 2,000 steps (docs/image-text.md).
    config = training.TrainConfig.create(
        "siglip", model="Mu/4", patch_size=7, dataset=f"captions:{captions}", image_size=28,
        steps=args.steps or 2000, batch_size=128, warmup_steps=100, weight_decay=0.05, train_augment="affine",
        seed=args.seed, workdir=workdir, precision=args.precision)
    print(f"== Training a SigLIP ({config.model}, sigmoid loss) from scratch on {len(train_labels)} digits with "
          f"captions in {len(PHRASINGS)} phrasings -> {workdir}")
    start = time.time()
    results = training.train(config)
    model = from_pretrained(workdir, task="image_text")
    inputs = read_processor(model).inputs(list(test_images))
    probabilities = model.zero_shot(inputs, DIGIT_WORDS, [HELD_OUT_PHRASING])
    accuracy = float(np.mean(probabilities.argmax(1) == test_labels))
    print(f"== Zero-shot on the 1,000 held-out digits, labels written as {HELD_OUT_PHRASING!r} (a phrasing no "
          f"caption used): top-1 {accuracy:.2%} ({results['steps']} steps, {time.time() - start:.0f} s in all)")
    with open(os.path.join(workdir, "demo.json"), "w") as f:
        json.dump({"zero_shot_top1": accuracy, "phrasing": HELD_OUT_PHRASING, "steps": results["steps"],
                   "wall_time_s": time.time() - start}, f, indent=2)
    return 0
