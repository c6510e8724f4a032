"""`keras-vit search MODEL FOLDER --text "..."`: a folder's images ranked for a sentence, by an
image-text model (SigLIP, SigLIP2, CLIP, MetaCLIP 2); `--image FILE --labels a,b,c` (or
`--labels-file`) ranks texts for an image instead.

The folder's embeddings are kept in FOLDER/.keras-vit-embeddings (keras_vit.model.image_index),
so a second query embeds only the text. Scores are cosine similarities of the two embeddings
(the same scale for every family and query); `--image` prints the family's probabilities, as
`keras-vit zero-shot` does.
"""

from __future__ import annotations

import json
import os
import sys

from keras_vit.utils.flags import UsageError, positive_int


def add_arguments(parser):
    from keras_vit.cli.zero_shot import MODEL_HELP

    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("folder", nargs="?", help="the folder of images to rank (with --text)")
    parser.add_argument("--text", help="the sentence to rank the folder's images for")
    parser.add_argument("--image", help="an image to rank texts for (with --labels or --labels-file)")
    parser.add_argument("--labels", help="with --image: the texts, comma-separated")
    parser.add_argument("--labels-file", help="with --image: a file of texts (labels or captions), one per line")
    parser.add_argument("--top", type=positive_int, default=10, help="results to show (default 10)")
    parser.add_argument("--recursive", action="store_true", help="also read images in sub-folders")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per step (default 32)")
    parser.add_argument("--json", action="store_true", help="print one JSON line per result")


def run(args):
    if (args.text is None) == (args.image is None):
        raise UsageError("give --text SENTENCE (with a FOLDER to rank its images) or --image FILE (with --labels "
                         "to rank texts for it).")
    if args.text is not None:
        if not args.folder or not os.path.isdir(args.folder):
            raise UsageError(f"--text ranks a folder's images: give the FOLDER ({args.folder!r} is not one).")
        return _rank_images(args)
    return _rank_texts(args)


def _rank_images(args) -> int:
    import numpy as np

    from keras_vit.model.image_index import folder_embeddings
    from keras_vit.model.image_text import normalized
    from keras_vit.model.pretrained import from_pretrained
    from keras_vit.model.processor import read_processor

    if not args.text.strip():
        raise UsageError("--text is empty: give the sentence to search for.")
    model = from_pretrained(args.model, task="image_text")
    paths, embeddings, failures, embedded = folder_embeddings(model, read_processor(model), args.folder,
                                                              args.recursive, args.batch_size)
    for path, reason in failures:
        print(f"keras-vit search: skipped {path}: {reason}", file=sys.stderr)
    if not paths:
        raise UsageError(f"{args.folder} holds no readable image.")
    scores = normalized(embeddings) @ normalized(model.text_embeddings([args.text]))[0]
    order = np.argsort(-scores, kind="stable")[:args.top]
    for i in order:
        _show({"image": paths[i], "score": float(scores[i])}, args.json, paths[i], scores[i])
    print(f"keras-vit search: {len(paths)} images ({embedded} embedded now, the others from "
          f"{os.path.join(args.folder, '.keras-vit-embeddings')})", file=sys.stderr)
    return 0


def _rank_texts(args) -> int:
    import numpy as np

    from keras_vit.cli.zero_shot import read_labels
    from keras_vit.model.image_text import check_labels
    from keras_vit.model.pretrained import from_pretrained
    from keras_vit.model.processor import read_processor

    texts = check_labels(read_labels(args.labels, args.labels_file))
    model = from_pretrained(args.model, task="image_text")
    inputs, read, failed = read_processor(model).read([args.image])
    if not read:
        raise UsageError(f"cannot read --image {args.image}: {failed[0][1]}.")
    probabilities = model.zero_shot(inputs, texts)[0]
    for i in np.argsort(-probabilities, kind="stable")[:args.top]:
        _show({"text": texts[i], "score": float(probabilities[i])}, args.json, texts[i], probabilities[i])
    return 0


def _show(record, as_json, what, score):
    print(json.dumps(record) if as_json else f"{score:7.4f}  {what}")
