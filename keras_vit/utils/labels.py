"""Class names: the one check a list of labels passes (one per class, one per
line), at the bottom of the layering so that the model (`ViT.labels`), the run
folder (`labels.txt`) and the exporters share it."""

from __future__ import annotations

from typing import List, Sequence

from keras_vit.errors import UserError


def check_labels(labels: Sequence[str], num_classes: int) -> List[str]:
    labels = [str(label) for label in labels]
    if len(labels) != num_classes:
        raise UserError(f"{len(labels)} labels for a model with {num_classes} classes.")
    if any("\n" in label or "\r" in label for label in labels):
        raise UserError("Labels cannot contain line breaks (they are kept one per line).")
    return labels


def labels_in_text(text: str) -> List[str]:
    """The class names of a labels.txt's text: one a line (either line ending), index = class id;
    a trailing newline is not a class."""
    names = [line.rstrip("\r") for line in text.split("\n")]
    while names and not names[-1].strip():
        names.pop()
    return names


def default_labels(num_classes: int) -> List[str]:
    return [str(i) for i in range(num_classes)]
