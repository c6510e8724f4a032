"""masks:DIR and depth:DIR: images with a map each, for segmentation and depth
(keras_vit.tasks.segmentation, keras_vit.tasks.depth).

    DIR/images/NAME.jpg   an image (any keras_vit.images extension)
    DIR/masks/NAME.png    its mask: class ids (PNG mode L or P), 255 where no class is annotated
    DIR/depth/NAME.png    or its depth: a 16-bit PNG in millimetres, or NAME.npy in metres; 0 unknown
    DIR/classes.txt       optional: one class name a line (their count is the number of classes)

DIR may be local or on any filesystem keras_vit.utils.storage reads (gs://, ram://). DIR may
instead hold train/ and val/, each with images/ and masks/ (or depth/); without val/,
every 10th pair is held out for evaluation. `masks:TRAIN,EVAL` names the evaluation folder, read
whole (what `keras-vit evaluate` asks for). An image without its map is named once and left out;
a map of another size, a class id the run does not have, a depth map without a known pixel are
named and skipped as undecodable files are (--strict-data: an error).
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from keras_vit.errors import UserError
from keras_vit.images import IMAGE_EXTENSIONS
from keras_vit.training.sources.fielded import _decoder
from keras_vit.training.sources.source import HELD_OUT_EVERY, DecodeProblems, table_source
from keras_vit.utils import storage
from keras_vit.utils.console import warn

# kind of data -> (its maps' folder, the field, the extensions a map may have, in the order tried)
KINDS = {"masks": ("masks", "mask", (".png",)), "depth": ("depth", "depth", (".png", ".npy"))}
DEPTH_PNG_METRES = 0.001  # a depth PNG holds millimetres
CLASSES_FILE = "classes.txt"


def maps_source(config, kind: str, spec: str, fields):
    """The Source of masks:SPEC or depth:SPEC: fields image and mask (or depth)."""
    name, problems = f"{kind}:{spec}", DecodeProblems()
    train_dir, _, eval_dir = spec.partition(",")
    root = os.path.expanduser(train_dir)
    train, held = _splits(root, kind)
    if eval_dir:
        held = _whole(os.path.expanduser(eval_dir), kind)
    if held is None:
        every = np.arange(len(train)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        train, held = [p for p, h in zip(train, every) if not h], [p for p, h in zip(train, every) if h]
    field = KINDS[kind][1]
    class_names = read_class_names(root) if kind == "masks" else None
    num_classes = _num_classes(config, name, class_names) if kind == "masks" else 1
    splits = {split: (np.array([os.fsencode(i) for i, _ in pairs], dtype=bytes),
                      np.array([os.fsencode(m) for _, m in pairs], dtype=bytes))
              for split, pairs in (("train", train), ("eval", held))}
    order = ("image", field)
    decode = _decoder(order, fields, name, config.strict_data, problems, num_classes, DEPTH_PNG_METRES)
    return table_source(splits, name=name, num_classes=num_classes, num_channels=3, image_size=None,
                        train_split="train", eval_split="eval", decode=decode, problems=problems, fields=order,
                        class_names=class_names)


def _splits(root: str, kind: str) -> Tuple[List[tuple], Optional[List[tuple]]]:
    """(training pairs, evaluation pairs or None: hold out a share) of a folder."""
    if not storage.isdir(root):
        raise UserError(f"{kind}:{root} is not a folder: give a folder with images/ and {KINDS[kind][0]}/ "
                        f"(or train/ and val/ sub-folders, each with both).")
    if storage.isdir(storage.join(root, "train")):
        val = storage.join(root, "val")
        return pairs_in(storage.join(root, "train"), kind), (pairs_in(val, kind) if storage.isdir(val) else None)
    return pairs_in(root, kind), None


def _whole(root: str, kind: str) -> List[tuple]:
    """Every pair of an evaluation folder: its val/ where it is split, else all of it."""
    if storage.isdir(storage.join(root, "val")):
        return pairs_in(storage.join(root, "val"), kind)
    return _splits(root, kind)[0]


def pairs_in(folder: str, kind: str) -> List[tuple]:
    """[(image path, map path)] of folder/images and folder/<maps>, by file stem, sorted; an image
    without a map is named in one warning and left out."""
    maps_folder, _, extensions = KINDS[kind]
    images_dir, maps_dir = storage.join(folder, "images"), storage.join(folder, maps_folder)
    for needed in (images_dir, maps_dir):
        if not storage.isdir(needed):
            raise UserError(f"{folder} has no {os.path.basename(needed)}/ folder: a {kind}: folder holds images/ "
                            f"and {maps_folder}/ with the same file names (cat.jpg, cat.png), or train/ and val/ "
                            f"each holding both.")
    maps = {}
    for entry in sorted(storage.listdir(maps_dir)):
        stem, extension = os.path.splitext(entry)
        if extension.lower() in extensions and stem not in maps:
            maps[stem] = storage.join(maps_dir, entry)
    pairs, missing = [], []
    for entry in sorted(storage.listdir(images_dir)):
        stem, extension = os.path.splitext(entry)
        if extension.lower() not in IMAGE_EXTENSIONS:
            continue
        if stem in maps:
            pairs.append((storage.join(images_dir, entry), maps[stem]))
        else:
            missing.append(entry)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        warn(f"{len(missing)} image(s) in {images_dir} have no {maps_folder[:-1] if kind == 'masks' else 'depth'} "
             f"file in {maps_dir} and are left out: {shown}.")
    if not pairs:
        raise UserError(f"{folder} has no image with a {maps_folder} file of the same name "
                        f"({'/'.join(extensions)}) in {maps_dir}.")
    return pairs


def read_class_names(root: str) -> Optional[List[str]]:
    """DIR/classes.txt's names, one a line (blank lines left out), or None without the file."""
    path = storage.join(root, CLASSES_FILE)
    if not storage.isfile(path):
        return None
    names = storage.read_lines(path)
    if not names:
        raise UserError(f"{path} names no class: write one class name a line, in the order of their ids.")
    return names


def _num_classes(config, name, class_names) -> int:
    if class_names is not None:
        if config.num_classes and int(config.num_classes) != len(class_names):
            raise UserError(f"--num-classes {config.num_classes} contradicts {name}'s {CLASSES_FILE}, which names "
                            f"{len(class_names)}: drop --num-classes, or fix the file.")
        return len(class_names)
    if not config.num_classes:
        raise UserError(f"{name} has no {CLASSES_FILE}, so the classes are not known: give --num-classes N (the "
                        f"masks' ids run 0..N-1), or write {CLASSES_FILE} with one name a line.")
    return int(config.num_classes)
