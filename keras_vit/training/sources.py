"""Where training data comes from: datasets by name or object, as Sources.

A Source yields raw examples of each split in a fixed order, says how one
epoch of a worker's shard is ordered (`shuffle_kind`, read by
keras_vit.training.stream) and decodes a raw example:

* "permutation" (folders, lists, Keras directory datasets, arrays, MNIST):
  the examples are addressable by index, so epoch e is a permutation of the
  worker's whole shard drawn from (seed, worker, e);
* "files" (TFRecord files, tfds): the files are reordered each epoch, their
  records interleaved, then shuffled in blocks;
* "buffer" (a tf.data.Dataset handed to train()): blocks of the dataset's
  own order, each shuffled.

Image files are checked cheaply before training (each file's header, by this
worker alone when there is one input pipeline) and decoded during training;
a file that fails to decode there is named in one warning, weighs nothing in
its batch (so the stream's positions do not move) and is counted in
results.json's "data_problems"; --strict-data stops instead.

Class checks are one rule for every source of classes (`_check_classes`):
no class is an error, an empty class an error (or dropped with
--drop-empty-classes, where its label can go), one class a warning.
"""

from __future__ import annotations

import dataclasses
import io
import os
import threading
from typing import Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit import _console, errors, mnist5k, storage
from keras_vit._console import warn  # data warnings: one line each on stderr, as every keras-vit warning
from keras_vit.errors import UserError

AUTOTUNE = tf.data.AUTOTUNE
EVAL_SPLIT_NAMES = ("validation", "val", "test", "eval")
HELD_OUT_EVERY = 10  # without an evaluation split, every 10th example of each class is held out
INTERLEAVE_FILES = 16  # record files read at once in a stream epoch


@dataclasses.dataclass
class Source:
    """One dataset: raw examples of each split and how to decode them.

    `examples(split, index, count)` returns shard `index` of `count` of the
    split in a fixed order (evaluation, few-shot); `epoch(split, index,
    count, seed)` the same shard's raw examples in epoch order for `seed`
    (an int64 pair: (run seed, epoch)), see the module docstring;
    `decode(raw)` maps a raw example to (uint8 or float image HWC in 0..255,
    int label, whether it decoded). `class_names`: the class names in label
    order where the data names them, else None. `shard_sizes(split, index,
    count)` where shards are not an even split of `sizes`.
    """

    name: str
    num_classes: int
    num_channels: int
    image_size: Optional[Tuple[int, int]]  # None: images of varying size
    sizes: dict  # split -> number of examples (None if unknown)
    train_split: str
    eval_split: str
    examples: Callable[[str, int, int], tf.data.Dataset]
    decode: Callable
    epoch: Callable[[str, int, int, tf.Tensor], tf.data.Dataset]
    shuffle_kind: str = "permutation"
    class_names: Optional[List[str]] = None
    shard_sizes: Optional[Callable[[str, int, int], Optional[int]]] = None
    problems: "DecodeProblems" = dataclasses.field(default_factory=lambda: DecodeProblems())  # files that failed

    def shard_size(self, split, index, count):
        if self.shard_sizes is not None:
            return self.shard_sizes(split, index, count)
        total = self.sizes.get(split)
        if total is None:
            return None
        return total // count + (1 if index < total % count else 0)


def _table_source(splits: dict, **fields) -> Source:
    """A Source over in-memory rows: {split: tuple of arrays (paths or pixels, labels)}."""

    def shard(split, index, count):
        return tuple(column[index::count] for column in splits[split])

    def examples(split, index, count):
        return tf.data.Dataset.from_tensor_slices(shard(split, index, count))

    def epoch(split, index, count, seed):
        # The permutation covers the worker's whole shard: the decode buffer
        # downstream only bounds memory, it takes no part in the mixing.
        rows = shard(split, index, count)
        columns = tuple(tf.constant(c) for c in rows)
        order = tf.random.experimental.stateless_shuffle(tf.range(len(rows[1]), dtype=tf.int64), seed=seed)
        return tf.data.Dataset.from_tensor_slices(order).map(
            tf.autograph.experimental.do_not_convert(lambda i: tuple(tf.gather(c, i) for c in columns)))

    return Source(sizes={k: len(v[1]) for k, v in splits.items()}, examples=examples, epoch=epoch,
                  shuffle_kind="permutation", **fields)


# --- sources -----------------------------------------------------------------

# The digits are read in keras_vit.mnist5k; these names stay for callers of the trainer's API.
mnist5k_path = mnist5k.path
read_mnist5k = mnist5k.read
load_mnist5k = mnist5k.split


def _mnist5k_source(config) -> Source:
    (x_train, y_train), (x_test, y_test) = mnist5k.split()
    return _table_source(
        {"train": (x_train, y_train), "test": (x_test, y_test)},
        name="mnist5k", num_classes=10, num_channels=1, image_size=(28, 28), train_split="train",
        eval_split="test", decode=_decoded, class_names=[str(i) for i in range(10)])


@tf.autograph.experimental.do_not_convert
def _decoded(raw):
    """decode() of sources whose raw examples are pixels already."""
    image, label = raw
    return image, tf.cast(label, tf.int32), tf.constant(True)


# --- files that fail to decode -----------------------------------------------

class DecodeProblems:
    """The image files of one source that failed to decode (a warning names
    each once); --strict-data makes the first one an error instead. Each
    Source holds its own (Source.problems): opening another source, in the
    same process, leaves this one's count as it was."""

    def __init__(self):
        self.lock = threading.Lock()  # decoders run in tf.data's threads
        self.failed = {}

    def report(self, where, reason, strict):
        message = f"{where} cannot be decoded ({reason})"
        if strict:
            raise UserError(f"{message}. Remove or repair it, or {_STRICT_MARK}")
        if self.record(where, reason):
            warn(f"{message}: it is left out of its batches (--strict-data, or strict_data=True in Python, stops instead).")

    def record(self, where, reason) -> bool:
        """Counts a failed file; True the first time it is seen."""
        with self.lock:
            first = where not in self.failed
            self.failed[where] = reason
        return first

    def summary(self):
        with self.lock:
            return {"undecodable_files": len(self.failed), "files": dict(sorted(self.failed.items())[:100])}


_STRICT_MARK = "drop --strict-data to leave such files out."


def strict_failure(error) -> Optional[str]:
    """The one-line message of a --strict-data stop inside a tf.data error, else None."""
    for line in str(error).splitlines():
        if _STRICT_MARK in line:
            return line[line.index("ValueError: ") + len("ValueError: "):] if "ValueError: " in line else line
    return None


def _pillow_decoder(channels, from_path, name, strict, problems: DecodeProblems):
    """Decodes (file path or encoded bytes, label) with keras_vit.images.decode,
    in the tf.data map (parallel: Pillow decodes without the GIL), so training
    sees the pixels predict, inspect and export see. A file that fails gives
    a blank image and ok=False (weight 0 downstream)."""

    def decode_value(value, label):
        try:
            return images_lib.decode(os.fsdecode(value) if from_path else value, channels), True
        except Exception as error:  # noqa: BLE001 - every decoder error makes the file unreadable
            where = os.fsdecode(value) if from_path else f"an encoded image of class {int(label)} in {name}"
            reason = images_lib.unreadable_reason(os.fsdecode(value), error) if from_path else str(error)
            problems.report(where, reason, strict)
            return np.zeros((8, 8, channels), np.uint8), False

    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        value, label = raw
        image, ok = tf.numpy_function(decode_value, [value, label], (tf.uint8, tf.bool), stateful=False)
        image.set_shape([None, None, channels])
        ok.set_shape([])
        return image, tf.cast(label, tf.int32), ok

    return decode


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
    return _table_source(
        splits, name=name, num_classes=len(classes), num_channels=3, image_size=None, train_split="train",
        eval_split="eval", decode=_pillow_decoder(3, True, name, config.strict_data, problems),
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


def _folder_source(config, root, shard) -> Source:
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


def _list_source(config, spec, shard) -> Source:
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


def _record_files_source(files: dict, parse, **fields) -> Source:
    """A Source over record files, {split: [(path, skip, take, count or None)]}
    (`take` -1: to the end; `count`: the records taken, where known)."""

    def read(path, skip, take):
        return tf.data.TFRecordDataset(path).skip(skip).take(take)

    def columns(entries):
        return (tf.constant([e[0] for e in entries], tf.string), tf.constant([e[1] for e in entries], tf.int64),
                tf.constant([e[2] for e in entries], tf.int64))

    def by_files(split, count):
        # Whole files per worker where there are enough of them; else every
        # worker reads every file and keeps every count-th record.
        return len(files[split]) >= count > 1

    def examples(split, index, count):
        ds = tf.data.Dataset.from_tensor_slices(columns(files[split])).flat_map(read)
        return ds.shard(count, index).map(parse)

    def epoch(split, index, count, seed):
        entries = files[split][index::count] if by_files(split, count) else files[split]
        paths, skips, takes = columns(entries)
        # The file order of epoch e is the same on every worker (record shards stay disjoint).
        order = tf.random.experimental.stateless_shuffle(tf.range(len(entries)), seed=seed)
        ds = tf.data.Dataset.from_tensor_slices(tuple(tf.gather(c, order) for c in (paths, skips, takes)))
        ds = ds.interleave(read, cycle_length=min(INTERLEAVE_FILES, len(entries)), block_length=1,
                           num_parallel_calls=AUTOTUNE, deterministic=True)
        if not by_files(split, count):
            ds = ds.shard(count, index)
        return ds.map(parse)

    def shard_sizes(split, index, count):
        counts = [e[3] for e in files[split]]
        if None in counts:
            return None
        if by_files(split, count):
            return sum(counts[index::count])
        return sum(counts) // count + (1 if index < sum(counts) % count else 0)

    sizes = {split: (None if any(e[3] is None for e in entries) else sum(e[3] for e in entries))
             for split, entries in files.items()}
    return Source(sizes=sizes, examples=examples, epoch=epoch, shuffle_kind="files", shard_sizes=shard_sizes,
                  **fields)


def _tfrecord_source(config, root) -> Source:
    train_files = sorted(storage.glob(storage.join(root, "train*.tfrecord*")))
    eval_files = []
    for name in EVAL_SPLIT_NAMES:
        eval_files = sorted(storage.glob(storage.join(root, f"{name}*.tfrecord*")))
        if eval_files:
            break
    if not train_files or not eval_files:
        raise UserError(f"tfrecord:{root} needs train*.tfrecord* and one of "
                        f"{'/'.join(EVAL_SPLIT_NAMES)}*.tfrecord* files.")
    num_classes = config.num_classes
    class_names = None
    labels_txt = storage.join(root, "labels.txt")
    if storage.exists(labels_txt):
        class_names = [line.strip() for line in storage.read_text(labels_txt).splitlines() if line.strip()]
    if num_classes is None and class_names:
        num_classes = len(class_names)
    if num_classes is None:
        raise UserError(f"tfrecord:{root}: pass {_console.argument('num_classes', 'N')} (or write {labels_txt}, "
                        f"one class a line).")
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        return example["image"], example["label"]

    # The evaluation split is counted once: every worker must run as many eval steps.
    eval_size = int(tf.data.TFRecordDataset(eval_files).reduce(np.int64(0), lambda n, _: n + 1))
    name, problems = f"tfrecord:{root}", DecodeProblems()
    source = _record_files_source(
        {"train": [(f, 0, -1, None) for f in train_files], "eval": [(f, 0, -1, None) for f in eval_files]},
        parse, name=name, num_classes=int(num_classes), num_channels=3, image_size=None, train_split="train",
        eval_split="eval", decode=_pillow_decoder(3, False, name, config.strict_data, problems), problems=problems,
        class_names=class_names if class_names and len(class_names) == int(num_classes) else None)
    source.sizes["eval"] = eval_size
    return source


def _tfds():
    """tensorflow_datasets, or one line naming the extra that brings it."""
    return errors.require("tensorflow_datasets", "train", "Reading a tfds: dataset")


def _tfds_builder(config, name):
    """A prepared tfds builder: NAME[/CONFIG][:VERSION] in --data-dir, or a prepared
    dataset directory (.../NAME/VERSION). Never downloads: an unprepared dataset
    is an error that says how to prepare it."""
    tfds = _tfds()

    if storage.isdir(name):
        try:
            return tfds.builder_from_directory(name)
        except Exception as error:  # noqa: BLE001 - whatever tfds raises, say what the folder must be
            raise UserError(f"tfds:{name}: not a prepared tfds dataset directory (it needs the dataset_info.json "
                            f"that download_and_prepare writes, e.g. DATA_DIR/NAME/1.0.0): {error}") from None
    try:
        builder = tfds.builder(name, data_dir=config.data_dir)
    except Exception as error:  # noqa: BLE001 - unknown names, bad configs
        raise UserError(f"tfds:{name}: {type(error).__name__}: {str(error).splitlines()[0]}") from None
    if not builder.is_prepared():
        raise UserError(
            f"tfds:{name} is not prepared in {builder.data_dir}; training never downloads. Prepare it once on a "
            f"machine with network access: python -c \"import tensorflow_datasets as tfds; "
            f"tfds.builder('{name}', data_dir='DATA_DIR').download_and_prepare()\", then pass "
            f"{_console.argument('data_dir', 'DATA_DIR')} "
            f"(or tfds:DATA_DIR/NAME/VERSION).")
    return builder


def _tfds_source(config, name) -> Source:
    tfds = _tfds()

    builder = _tfds_builder(config, name)
    info = builder.info
    image_key = "image" if "image" in info.features else next(
        k for k, v in info.features.items() if isinstance(v, tfds.features.Image))
    label_key = "label"
    splits = list(info.splits)
    eval_split = config.eval_split or next((s for s in ("validation", "test") if s in splits), None)
    if eval_split is None or config.train_split not in splits:
        raise UserError(f"tfds:{name} has splits {splits}; pass "
                        f"{_console.either('--train-split/--eval-split', 'train_split=/eval_split=')}.")
    shape = info.features[image_key].shape
    channels = shape[-1] or 3
    size = tuple(shape[:2]) if None not in shape[:2] else None
    label_feature = info.features[label_key]
    problems = DecodeProblems()
    fields = dict(name=f"tfds:{name}", num_classes=label_feature.num_classes, num_channels=channels,
                  image_size=size, train_split=config.train_split, eval_split=eval_split,
                  decode=_pillow_decoder(channels, False, f"tfds:{name}", config.strict_data, problems),
                  class_names=list(label_feature.names), problems=problems)
    if str(getattr(info, "file_format", "tfrecord")).lower().endswith("tfrecord"):
        def parse(record):
            example = info.features.deserialize_example(record, decoders={image_key: tfds.decode.SkipDecoding()})
            return example[image_key], example[label_key]

        return _record_files_source({s: _tfds_files(info.splits[s]) for s in splits}, parse, **fields)

    def examples(split, index, count):
        # even_splits reads only this worker's part of the files.
        sub = tfds.even_splits(split, n=count)[index] if count > 1 else split
        ds = builder.as_dataset(split=sub, shuffle_files=False, decoders={image_key: tfds.decode.SkipDecoding()})
        return ds.map(lambda e: (e[image_key], e[label_key]))

    return Source(sizes={s: info.splits[s].num_examples for s in splits}, examples=examples,
                  epoch=lambda split, index, count, seed: examples(split, index, count), shuffle_kind="buffer",
                  **fields)


def _tfds_files(split_info):
    """(path, skip, take, count) of each file of a prepared tfds split."""
    out = []
    for instruction in split_info.file_instructions:
        skip = int(instruction.skip or 0)
        take = int(instruction.take) if instruction.take is not None and instruction.take >= 0 else -1
        count = take if take >= 0 else int(instruction.examples_in_shard) - skip
        out.append((os.fspath(instruction.filename), skip, take, count))
    return out


# Named, not lambdas: AutoGraph cannot tell two lambdas on one line apart and
# says so in a warning to the user.
def _is_held_out(index, example):
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def _is_kept(index, example):
    return index % HELD_OUT_EVERY != HELD_OUT_EVERY - 1


def _unnumbered(index, example):
    return example


def _object_source(config, dataset, shard) -> Source:
    """train(config, dataset=...): see open_source."""
    if isinstance(dataset, (tuple, list)) and len(dataset) == 2 and all(isinstance(d, np.ndarray) for d in dataset):
        return _array_source(config, *dataset)
    if isinstance(dataset, (tuple, list)):
        if len(dataset) != 2:
            raise UserError("dataset= takes a tf.data.Dataset of (image, label), a (train, eval) pair of them, "
                            "or a keras.utils.image_dataset_from_directory dataset.")
        train, held = dataset
    else:
        train, held = dataset, None
    file_paths = getattr(train, "file_paths", None)
    if file_paths is not None and getattr(train, "class_names", None):
        return _keras_directory_source(config, train, held, shard)
    if not isinstance(train, tf.data.Dataset) or (held is not None and not isinstance(held, tf.data.Dataset)):
        raise UserError(f"dataset= must be a tf.data.Dataset of (image, label), a (train, eval) pair of them, or "
                        f"a keras.utils.image_dataset_from_directory dataset; got {type(train).__name__}.")
    train, held = _examples_of(train), None if held is None else _examples_of(held)
    if held is None:
        # One dataset: every 10th example is held out for evaluation.
        numbered = train.enumerate()
        held = numbered.filter(_is_held_out).map(_unnumbered)
        train = numbered.filter(_is_kept).map(_unnumbered)
    datasets = {"train": train, "eval": held}
    image_spec = train.element_spec[0]
    if image_spec.shape.rank != 3 or image_spec.shape[-1] is None:
        raise UserError(f"dataset= elements must be (image (H, W, C), label); got image shape {image_spec.shape}.")
    sizes = {k: int(v.reduce(np.int64(0), lambda n, _: n + 1)) for k, v in datasets.items()}
    class_names = getattr(dataset if not isinstance(dataset, (tuple, list)) else dataset[0], "class_names", None)
    num_classes = config.num_classes or (len(class_names) if class_names else None)
    if num_classes is None:  # one pass over the labels
        num_classes = 1 + max(int(v.map(lambda image, label: tf.cast(label, tf.int64)).reduce(
            np.int64(-1), tf.maximum)) for v in datasets.values())
    size = tuple(image_spec.shape[:2]) if None not in image_spec.shape[:2] else None
    # Images of varying sizes travel as serialized tensors (one string each),
    # so that the stream's shuffle blocks can batch them.
    raw_of, decode = (_as_is, _decoded) if size is not None else (_serialized, _parsed(image_spec))

    def examples(split, index, count):
        return datasets[split].shard(count, index).map(raw_of)

    # Not addressable by index: each epoch is the dataset's own order, shuffled in blocks.
    return Source(
        name="dataset", num_classes=int(num_classes), num_channels=int(image_spec.shape[-1]), image_size=size,
        sizes=sizes, train_split="train", eval_split="eval", examples=examples, decode=decode,
        epoch=lambda split, index, count, seed: examples(split, index, count), shuffle_kind="buffer",
        class_names=list(class_names) if class_names else None,
    )


@tf.autograph.experimental.do_not_convert
def _as_is(image, label):
    return image, label


@tf.autograph.experimental.do_not_convert
def _serialized(image, label):
    return tf.io.serialize_tensor(image), label


def _parsed(image_spec):
    """decode() of a serialized image of `image_spec`'s dtype and channels."""

    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        serialized, label = raw
        image = tf.io.parse_tensor(serialized, image_spec.dtype)
        image.set_shape([None, None, image_spec.shape[-1]])
        return image, tf.cast(label, tf.int32), tf.constant(True)

    return decode


def _array_source(config, images, labels) -> Source:
    """dataset=(images (N, H, W, C) 0..255, labels (N,)): every 10th example held out."""
    if images.ndim != 4 or labels.shape != (len(images),):
        raise UserError(f"dataset=(images, labels) needs images (N, H, W, C) and labels (N,); got "
                        f"{images.shape} and {labels.shape}.")
    held = np.arange(len(labels)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    labels = labels.astype(np.int32)
    return _table_source(
        {"train": (images[~held], labels[~held]), "eval": (images[held], labels[held])},
        name="arrays", num_classes=int(config.num_classes or labels.max() + 1), num_channels=int(images.shape[-1]),
        image_size=tuple(images.shape[1:3]), train_split="train", eval_split="eval", decode=_decoded)


def _examples_of(ds):
    """(image, label) examples of a dataset of tuples or {"image", "label"} dicts, batched or not."""
    spec = ds.element_spec
    if isinstance(spec, dict):
        ds = ds.map(lambda e: (e["image"], e["label"]))
        spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise UserError(f"dataset= elements must be (image, label) pairs; got {spec}.")
    if spec[0].shape.rank == 4:
        ds = ds.unbatch()
    return ds


def _keras_directory_source(config, train, held, shard) -> Source:
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


def open_source(config, dataset=None, shard=(0, 1)) -> Source:
    """The Source named by config.dataset, or made from `dataset` when given.

    `dataset` (train(config, dataset=...)) is one of:
      * a tf.data.Dataset of (image HWC 0..255, label) pairs or {"image",
        "label"} dicts, batched or not: every 10th example is held out for
        evaluation; the classes are config.num_classes, else its
        `class_names`, else 1 + the largest label (one pass);
      * a (train, eval) pair of such datasets: nothing is held out;
      * a keras.utils.image_dataset_from_directory dataset (or a (train,
        validation) pair made with validation_split/subset): its files are
        re-read through keras_vit.images in a seeded, resumable order (its
        own shuffling and resizing are not used), every 10th image of each
        class held out when no validation dataset is given;
      * a pair of numpy arrays (images (N, H, W, C) 0..255, labels (N,)):
        every 10th example is held out; shuffled whole each epoch.
    A tf.data.Dataset is not addressable by index, so its epochs are
    shuffled in blocks of config.shuffle_buffer examples (see the module
    docstring); arrays, folders and lists are permuted whole.
    `shard` is (this input pipeline, number of pipelines): with several, the
    files are not checked before training (each worker meets its own).
    The trainer's stream is a pure function of (seed, examples consumed) only
    when a tf.data.Dataset yields the same elements in the same order on
    every pass (no unseeded shuffle inside it).
    """
    if dataset is not None:
        return _object_source(config, dataset, shard)
    spec = config.dataset
    if spec == "mnist5k":
        return _mnist5k_source(config)
    kind, _, arg = spec.partition(":")
    # The shell expands ~ only at the start of a word: folder:~/photos reaches us as typed.
    arg = os.path.expanduser(arg) if kind in ("folder", "list", "tfrecord") else arg
    if kind == "tfds" and arg:
        return _tfds_source(config, arg)
    if kind == "folder" and arg:
        return _folder_source(config, arg, shard)
    if kind == "list" and arg:
        return _list_source(config, arg, shard)
    if kind == "tfrecord" and arg:
        return _tfrecord_source(config, arg)
    raise UserError(f"Unknown dataset {spec!r}: use mnist5k, tfds:NAME, folder:PATH, list:FILE or tfrecord:DIR.")
