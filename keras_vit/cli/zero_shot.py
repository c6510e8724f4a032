"""`keras-vit zero-shot MODEL IMAGE|FOLDER... --labels a,b,c`: each image's probabilities over
labels written at run time, by an image-text model (SigLIP, SigLIP2, CLIP, MetaCLIP 2).

Images are read as the checkpoint's image processor reads them (preprocessor_config.json:
CLIP's shortest side resized then the centre cropped, SigLIP's whole image resized, SigLIP2's
each at its own patch grid), then scaled as its image tower takes them. Exit status as
`keras-vit predict`: 1 when some inputs failed (named on stderr), 2 when none was read.
"""

from __future__ import annotations

import json
import os

from keras_vit.utils.flags import UsageError, positive_int

MODEL_HELP = ("an HF transformers image-text folder (SiglipModel, Siglip2Model, CLIPModel or MetaClip2Model, saved "
              "with its tokenizer and image processor) or hf:ORG/NAME")


def add_arguments(parser):
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("images", nargs="+", help="image files and/or folders of images")
    parser.add_argument("--labels", help="the labels, comma-separated: --labels cat,dog,'a red car'")
    parser.add_argument("--labels-file", help="a text file of labels, one per line")
    parser.add_argument("--template", action="append", default=None,
                        help="a prompt holding the label as {}, e.g. 'a photo of a {}.'; repeat it for an ensemble "
                             "(each label: the mean of its normalised prompts); default: the label as given")
    parser.add_argument("--top", type=positive_int, default=5, help="labels to show per image (default 5)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per step (default 32)")
    parser.add_argument("--recursive", action="store_true", help="also read images in sub-folders")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON line per image: {"image": PATH, "scores": {LABEL: PROBABILITY}}')


def read_labels(labels, labels_file):
    """The labels of --labels or --labels-file (exactly one of them)."""
    if (labels is None) == (labels_file is None):
        raise UsageError("give the labels with --labels a,b,c or --labels-file FILE (one of the two).")
    if labels is not None:
        return [label.strip() for label in labels.split(",")]
    if not os.path.isfile(labels_file):
        raise UsageError(f"--labels-file {labels_file}: no such file.")
    from keras_vit.utils import storage

    return storage.read_lines(labels_file)


def run(args):
    import numpy as np

    from keras_vit.images import find_images
    from keras_vit.inspection.predict import folders_without_images, nothing_read, report_skipped
    from keras_vit.model.image_text import check_labels
    from keras_vit.model.pretrained import from_pretrained
    from keras_vit.model.processor import read_processor

    labels = check_labels(read_labels(args.labels, args.labels_file))
    model = from_pretrained(args.model, task="image_text")
    processor = read_processor(model)
    label_embeddings = model.label_embeddings(labels, args.template)
    files = find_images(args.images, args.recursive)
    failures, shown = folders_without_images(args.images, args.recursive), 0
    top = min(args.top, len(labels))
    for start in range(0, len(files), args.batch_size):
        pixels, read, failed = processor.read(files[start:start + args.batch_size])
        failures += failed
        if not read:
            continue
        probabilities = model.probabilities(model.logits_of_embeddings(model.image_embeddings(pixels),
                                                                       label_embeddings))
        for path, row in zip(read, probabilities):
            order = np.argsort(-row, kind="stable")[:top]
            _show(path, [(labels[i], float(row[i])) for i in order], args.json)
            shown += 1
    if not shown:
        raise UsageError(nothing_read(failures))
    return report_skipped("zero-shot", failures, shown, "classified")


def _show(path, scores, as_json):
    if as_json:
        print(json.dumps({"image": path, "scores": dict(scores)}))
        return
    print(path)
    for label, probability in scores:
        print(f"  {probability:7.4f}  {label}")
