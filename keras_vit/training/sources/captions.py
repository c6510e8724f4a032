"""captions:FILE, images with a caption each, for image-text training (keras_vit.tasks.image_text):
the forms of keras_vit.text.captions (a CSV or JSONL of image,caption pairs, or a folder of images
with a .txt caption each). Every 10th pair is held out for evaluation; an image that is missing or
unreadable is named once and skipped, as a folder's dirty files are.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.text.captions import read_captions
from keras_vit.training.sources.fielded import _decoder
from keras_vit.training.sources.source import HELD_OUT_EVERY, DecodeProblems, table_source


def captions_source(config, spec, kinds):
    """The Source of captions:SPEC: fields image and text."""
    name, problems = f"captions:{spec}", DecodeProblems()
    pairs = read_captions(spec)
    paths = np.array([os.fsencode(path) for path, _ in pairs], dtype=bytes)
    texts = np.array([caption.strip().encode("utf-8") for _, caption in pairs], dtype=bytes)
    held = np.arange(len(pairs)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    splits = {"train": (paths[~held], texts[~held]), "eval": (paths[held], texts[held])}
    order = ("image", "text")
    return table_source(splits, name=name, num_classes=1, num_channels=3, image_size=None, train_split="train",
                        eval_split="eval", decode=_decoder(order, kinds, name, config.strict_data, problems, 1),
                        problems=problems, fields=order, class_names=None)
