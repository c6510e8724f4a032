"""Image files as Sources: folder:PATH, list:TRAIN[,EVAL] and a Keras
image_dataset_from_directory dataset; their header check before training, the held-out
evaluation split and the one rule for classes (`_check_classes`)."""

from __future__ import annotations

import io
import os

import numpy as np

from keras_vit import images as images_lib
from keras_vit.utils import storage
from keras_vit.utils.console import warn
from keras_vit.errors import UserError
from keras_vit.training.sources.source import (
    EVAL_SPLIT_NAMES, HELD_OUT_EVERY, DecodeProblems, Source, pillow_decoder, table_source)


# --- image files ---------------------------------------------------------------

def _held_out(files_by_class):
    """Every HELD_OUT_EVERY-th file of each class (in the given order) -> eval; the rest train."""
    train = {c: [f for i, f in enumerate(fs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
             for c, fs in files_by_class.items()}
    held = {c: [f for i, f in enumerate(fs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
            for c, fs in files_by_class.items()}
    unseen = [f"{c} ({len(fs)})" for c, fs in files_by_class.items() if fs and not held[c]]
    if unseen:  # said, not silent: the evaluation's top-1 would leave these classes out
        warn(f"{len(unseen)} class(es) have fewer than {HELD_OUT_EVERY} images, so none is held out and they are "
             f"not evaluated: {', '.join(unseen[:5])}{' ...' if len(unseen) > 5 else ''}. Add images, or give an "
             f"evaluation split of your own (list:TRAIN.csv,EVAL.csv, or a folder with train/ and val/).")
    return train, held


def _file_source(config, name, classes, train_files, eval_files, problems) -> Source:
    """A Source over image files: {class: [path]} for the train and eval splits."""
    splits = {}
    for split, files in (("train", train_files), ("eval", eval_files)):
        pairs = [(f, i) for i, c in enumerate(classes) for f in files.get(c, [])]
        splits[split] = (np.array([os.fsencode(p) for p, _ in pairs], dtype=bytes),
                         np.array([label for _, label in pairs], np.int32))
    return table_source(
        splits, name=name, num_classes=len(classes), num_channels=3, image_size=None, train_split="train",
        eval_split="eval", decode=pillow_decoder(3, True, name, config.strict_data, problems),
        class_names=list(classes), problems=problems)


def _leave_out_unreadable(config, name, files_by_split, shard, problems):
    """The cheap check before training: each file's size and header (not its
    pixels). Failures are named in one warning and left out (an error with
    --strict-data). With several input pipelines nothing is checked here:
    every worker would read every header, and the class lists must agree;
    each worker meets its own bad files when it decodes them."""
    if shard[1] > 1:
        return files_by_split
    paths = [f for files in files_by_split for fs in files.values() for f in fs]
    bad = images_lib.find_unopenable(paths, description=f"Checking {len(paths)} image headers",
                                     progress=config.progress)
    if not bad:
        return files_by_split
    listed = "; ".join(f"{path} ({reason})" for path, reason in bad)
    message = f"{name}: {len(bad)} of {len(paths)} image files cannot be decoded: {listed}"
    if config.strict_data:
        raise UserError(f"{message}. Remove or repair them, or drop --strict-data (strict_data) to leave them out.")
    warn(f"{message}. They are left out (--strict-data, or strict_data=True in Python, stops instead).")
    for path, reason in bad:
        problems.record(path, reason)
    bad_paths = {p for p, _ in bad}
    return [{c: [f for f in fs if f not in bad_paths] for c, fs in files.items()} for files in files_by_split]


def _check_classes(config, name, classes, train_files, where=None, numbered=False):
    """The one rule for classes, whatever lists them: none is an error; an
    empty one an error naming it (or, with --drop-empty-classes, dropped; a
    numbered class keeps its place, as integer labels keep their values, and
    its output sees no image); one class with images warns. `where`: the
    folder of the class sub-folders, None where classes are labels of a list."""
    empty = [c for c in classes if not train_files.get(c)]
    what = "class folder(s)" if where is not None else "class(es)"
    if empty:
        listed = ", ".join(storage.join(where, c) if where else repr(c) for c in empty)
        if not config.drop_empty_classes:
            raise UserError(f"{name}: {len(empty)} {what} hold no readable images: {listed}. Add images, "
                            f"remove them, or pass --drop-empty-classes (drop_empty_classes=True) to leave them out.")
        if numbered:
            warn(f"{name}: {len(empty)} numbered class(es) without images: {listed}; the labels keep their values, "
                 f"so their outputs stay in the head and see no image.")
        else:
            warn(f"{name}: dropping {len(empty)} empty {what}: {listed}.")
            classes = [c for c in classes if c not in empty]
    populated = [c for c in classes if train_files.get(c)]
    if not populated:
        raise UserError(f"{name} holds no images in any class ({', '.join(images_lib.IMAGE_EXTENSIONS)})"
                        + (": put each class's images in a sub-folder of its own." if where is not None else "."))
    if len(populated) == 1:
        warn(f"{name} has a single class ({populated[0]!r}): a classifier has nothing to tell apart "
             f"(degenerate data).")
    return classes


def folder_source(config, root, shard) -> Source:
    if not storage.isdir(root):
        raise UserError(f"folder:{root}: no such directory.")
    name, problems = f"folder:{root}", DecodeProblems()
    train_dir = storage.join(root, "train")
    eval_dir = next((storage.join(root, n) for n in EVAL_SPLIT_NAMES if storage.isdir(storage.join(root, n))), None)

    def listing(directory):
        classes = images_lib.class_folders(directory)
        return classes, {c: images_lib.list_images(storage.join(directory, c)) for c in classes}

    if storage.isdir(train_dir) and eval_dir:
        classes, train_files = listing(train_dir)
        eval_classes, eval_files = listing(eval_dir)
        if eval_classes != classes:
            raise UserError(f"{name}: train/ and {storage.basename(eval_dir)}/ have different classes.")
        train_files, eval_files = _leave_out_unreadable(config, name, [train_files, eval_files], shard, problems)
        where = train_dir
    else:
        classes, all_files = listing(root)
        (all_files,) = _leave_out_unreadable(config, name, [all_files], shard, problems)
        train_files, eval_files = _held_out(all_files)
        where = root
    classes = _check_classes(config, name, classes, train_files, where)
    return _file_source(config, name, classes, train_files, eval_files, problems)


def _read_list(path):
    """(path, label) rows of a CSV (optional header) or JSON list file; paths relative to the file."""
    import csv
    import json

    if not storage.isfile(path):
        raise UserError(f"list:{path}: no such file (a CSV or JSON list of image path, label).")
    with io.StringIO(storage.read_text(path)) as f:
        if path.lower().endswith(".json"):
            rows = [(n, r) for n, r in enumerate(json.load(f), 1)]
        else:  # numbered by line, as an editor shows them
            reader = csv.reader(f)
            rows = [(reader.line_num, r) for r in reader if r and any(cell.strip() for cell in r)]
            if rows and rows[0][1][0].strip().lower() in ("path", "file", "filename", "image"):
                rows = rows[1:]
    base = storage.dirname(storage.abspath(path))

    def located(p):
        p = str(p).strip()
        return p if storage.is_remote(p) or os.path.isabs(p) else storage.join(base, p)

    return [(located(p), label) for p, label in (_list_row(path, n, r) for n, r in rows)]


def _list_row(path, number, row):
    """(path, label) of one row; a row without both names itself (a label left out is silent otherwise)."""
    kind = "entry" if path.lower().endswith(".json") else "line"
    cells = (row.get("path"), row.get("label")) if isinstance(row, dict) else tuple(row)
    if len(cells) != 2 or any(cell is None or not str(cell).strip() for cell in cells):
        shown = ",".join(map(str, row.values() if isinstance(row, dict) else row))
        raise UserError(f"list:{path}: {kind} {number} ({shown[:60]!r}) is not (image path, label): give every "
                        f"row an image path and its label.")
    return cells[0], str(cells[1]).strip()


def _list_classes(labels):
    """(class names in label order, whether they are numbers): integers keep
    their values (0..max), names are sorted."""
    if labels and all(label.lstrip("-").isdigit() for label in labels):
        if any(label.startswith("-") for label in labels):
            raise UserError(f"list: negative label {min(labels, key=int)}: integer labels are class numbers "
                            f"0, 1, ...; renumber them or use class names.")
        return [str(i) for i in range(max(int(label) for label in labels) + 1)], True
    return sorted(set(labels)), False


def list_source(config, spec, shard) -> Source:
    """list:TRAIN[,EVAL]: CSV/JSON lists of (image path, label); without EVAL, every
    10th image of each class is held out."""
    name, problems = f"list:{spec}", DecodeProblems()
    files = spec.split(",")
    if len(files) > 2:
        raise UserError(f"{name}: give list:TRAIN or list:TRAIN,EVAL.")
    rows = [_read_list(f) for f in files]
    classes, numbered = _list_classes([label for table in rows for _, label in table])

    def by_class(table):
        grouped = {c: [] for c in classes}
        for p, label in table:
            grouped[str(int(label)) if numbered else label].append(p)
        return grouped

    if len(rows) == 2:
        train_files, eval_files = _leave_out_unreadable(config, name, [by_class(rows[0]), by_class(rows[1])],
                                                        shard, problems)
    else:
        (all_files,) = _leave_out_unreadable(config, name, [by_class(rows[0])], shard, problems)
        train_files, eval_files = _held_out(all_files)
    classes = _check_classes(config, name, classes, train_files, numbered=numbered)
    return _file_source(config, name, classes, train_files, eval_files, problems)


def keras_directory_source(config, train, held, shard) -> Source:
    """A keras.utils.image_dataset_from_directory dataset: its files, re-read by
    keras_vit.images (seeded, resumable order; the pixels predict sees)."""
    classes = list(train.class_names)

    def by_class(ds):
        grouped = {c: [] for c in classes}
        for path in sorted(ds.file_paths):
            parent = os.path.basename(os.path.dirname(path))
            if parent not in grouped:
                raise UserError(f"dataset=: {path} is not inside a folder named after one of {classes}.")
            grouped[parent].append(path)
        return grouped

    name, problems = "image_dataset_from_directory", DecodeProblems()
    if held is not None:
        train_files, eval_files = _leave_out_unreadable(config, name, [by_class(train), by_class(held)], shard,
                                                        problems)
    else:
        (all_files,) = _leave_out_unreadable(config, name, [by_class(train)], shard, problems)
        train_files, eval_files = _held_out(all_files)
    classes = _check_classes(config, name, classes, train_files)
    return _file_source(config, name, classes, train_files, eval_files, problems)
