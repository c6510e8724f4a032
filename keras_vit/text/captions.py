"""Caption files, images with a caption each, as people write them (image-text training's
`captions:` data, keras_vit.training.sources.captions; a tokenizer learned from them):

    captions:pairs.csv      a CSV with a header naming `image` (a path relative to the file) and
                            `caption`; other columns are left alone
    captions:pairs.jsonl    one JSON object a line, with the same keys
    captions:DIR            a folder of images, each with a caption file of the same stem (.txt)

A pair whose caption is empty is refused before any work (line numbers named); whether each image
can be read is for the reader of the pairs (training names a dirty image once and skips it).
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import List, Tuple

from keras_vit import images as images_lib
from keras_vit.errors import UserError
from keras_vit.utils import storage


def read_captions(spec: str) -> List[Tuple[str, str]]:
    """[(image path, caption)] of captions:SPEC, paths made absolute."""
    if storage.isdir(spec):
        return _folder(spec)
    if not storage.isfile(spec):
        raise UserError(f"captions:{spec} does not exist: give a CSV or JSONL file of image,caption pairs, or a "
                        f"folder of images with a .txt caption each.")
    text = storage.read_text(spec).lstrip("\ufeff")
    base = storage.dirname(storage.abspath(spec))
    rows = _jsonl(text, spec) if spec.lower().endswith((".jsonl", ".json")) else _csv(text, spec)
    empty = [number for number, (_, caption) in rows if not caption.strip()]
    if empty:
        shown = ", ".join(map(str, empty[:5])) + (" ..." if len(empty) > 5 else "")
        raise UserError(f"captions:{spec}: {len(empty)} pair(s) have an empty caption (line {shown}): give each image "
                        f"its caption, or remove the line.")
    located = [(path if storage.is_remote(path) or os.path.isabs(path) else storage.join(base, path), caption)
               for _, (path, caption) in rows]
    if not located:
        raise UserError(f"captions:{spec} holds no pairs.")
    return located


def _csv(text, spec):
    reader = csv.reader(io.StringIO(text))
    header = [cell.strip().lower() for cell in next(reader, [])]
    if "image" not in header or "caption" not in header:
        raise UserError(f"captions:{spec}: the header is {','.join(header) or 'empty'}; it must name the columns "
                        f"image and caption (e.g. 'image,caption').")
    image, caption = header.index("image"), header.index("caption")
    return [(number, (row[image].strip(), row[caption])) for number, row in enumerate(reader, 2)
            if row and any(cell.strip() for cell in row)]


def _jsonl(text, spec):
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            rows.append((number, (str(record["image"]), str(record["caption"]))))
        except (ValueError, KeyError, TypeError) as error:
            raise UserError(f"captions:{spec}: line {number} is not a JSON object with 'image' and 'caption' "
                            f"({error}).") from None
    return rows


def _folder(folder):
    pairs, missing = [], []
    for path in images_lib.list_images(folder):
        caption = os.path.splitext(path)[0] + ".txt"
        if storage.isfile(caption):
            pairs.append((path, storage.read_text(caption).strip()))
        else:
            missing.append(os.path.basename(path))
    if missing:
        raise UserError(f"captions:{folder}: {len(missing)} image(s) have no caption file ({', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}): give each IMAGE a IMAGE-stem.txt beside it.")
    if not pairs:
        raise UserError(f"captions:{folder} holds no image with a caption.")
    empty = [os.path.basename(p) for p, c in pairs if not c]
    if empty:
        raise UserError(f"captions:{folder}: the caption files of {', '.join(empty[:3])} are empty: write each "
                        f"image's caption in its .txt.")
    return pairs


def captions(spec) -> List[str]:
    """The captions of captions:SPEC, training pairs and held-out alike (a tokenizer learns from them)."""
    return [caption.strip() for _, caption in read_captions(spec)]
