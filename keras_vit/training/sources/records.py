"""Record files as Sources: tfrecord:DIR and tfds (prepared datasets), read as
streams of files whose epochs reorder the files and shuffle their records in blocks."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from keras_vit import errors
from keras_vit.utils import console as _console, storage
from keras_vit.errors import UserError
from keras_vit.training.sources.source import (
    AUTOTUNE, EVAL_SPLIT_NAMES, INTERLEAVE_FILES, DecodeProblems, Source, pillow_decoder)


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


# A per-pixel Task's records: the image and its map as encoded files (a PNG of class ids; a 16-bit
# PNG of millimetres or a .npy of metres), under these names or those of TensorFlow's DeepLab.
IMAGE_FEATURES = ("image", "image/encoded")
MAP_FEATURES = {"mask": ("mask", "image/segmentation/class/encoded"), "depth": ("depth",)}


def tfrecord_source(config, root, fields=None) -> Source:
    train_files = sorted(storage.glob(storage.join(root, "train*.tfrecord*")))
    eval_files = []
    for name in EVAL_SPLIT_NAMES:
        eval_files = sorted(storage.glob(storage.join(root, f"{name}*.tfrecord*")))
        if eval_files:
            break
    if not train_files or not eval_files:
        raise UserError(f"tfrecord:{root} needs train*.tfrecord* and one of "
                        f"{'/'.join(EVAL_SPLIT_NAMES)}*.tfrecord* files.")
    per_pixel = next((field for field in MAP_FEATURES if field in (fields or {})), None)
    if per_pixel:
        return _map_records(config, root, train_files, eval_files, per_pixel, fields)
    num_classes = config.num_classes
    class_names = None
    labels_txt = storage.join(root, "labels.txt")
    if storage.exists(labels_txt):
        class_names = storage.read_lines(labels_txt)
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
        eval_split="eval", decode=pillow_decoder(3, False, name, config.strict_data, problems), problems=problems,
        class_names=class_names if class_names and len(class_names) == int(num_classes) else None)
    source.sizes["eval"] = eval_size
    return source


def _map_records(config, root, train_files, eval_files, field, fields) -> Source:
    """tfrecord:DIR for segmentation or depth: each record's image and its mask (or depth map),
    decoded and checked as masks:/depth: folders' files are (keras_vit.training.sources.maps)."""
    from keras_vit.training.sources.fielded import _decoder
    from keras_vit.training.sources.maps import DEPTH_PNG_METRES, _num_classes, read_class_names

    name, problems = f"tfrecord:{root}", DecodeProblems()
    class_names = read_class_names(root) if field == "mask" else None  # DIR/classes.txt, as a masks: folder's
    num_classes = _num_classes(config, name, class_names) if field == "mask" else 1
    names = {"image": IMAGE_FEATURES, field: MAP_FEATURES[field]}
    features = {key: tf.io.FixedLenFeature([], tf.string, default_value="") for keys in names.values() for key in keys}

    def filled(example, keys):  # the first of `keys` the record fills ("" where none)
        value = example[keys[-1]]
        for key in reversed(keys[:-1]):
            value = tf.where(tf.strings.length(example[key]) > 0, example[key], value)
        return value

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        return filled(example, IMAGE_FEATURES), filled(example, MAP_FEATURES[field])

    order = ("image", field)
    decode = _decoder(order, fields, name, config.strict_data, problems, num_classes, DEPTH_PNG_METRES,
                      encoded=True)
    eval_size = int(tf.data.TFRecordDataset(eval_files).reduce(np.int64(0), lambda n, _: n + 1))
    source = _record_files_source(
        {"train": [(f, 0, -1, None) for f in train_files], "eval": [(f, 0, -1, None) for f in eval_files]},
        parse, name=name, num_classes=num_classes, num_channels=3, image_size=None, train_split="train",
        eval_split="eval", decode=decode, problems=problems, fields=order, class_names=class_names)
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


def tfds_source(config, name) -> Source:
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
                  decode=pillow_decoder(channels, False, f"tfds:{name}", config.strict_data, problems),
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
