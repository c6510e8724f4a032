"""Input pipelines: datasets by name, deterministic and resumable, one per worker.

Every source yields raw examples in a fixed order; the training stream is
epoch e = the worker's shard shuffled (in blocks of `shuffle_buffer`
examples, whole when it fits) with seed (seed, worker, e), so the
position in the stream is one number (examples consumed) that a checkpoint
stores and a resumed run skips to. Augmentations are stateless random ops
seeded by the example's index in that stream, hence identical however many
decode threads run and however often the run restarts.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import sys
from typing import Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit import mnist5k

AUTOTUNE = tf.data.AUTOTUNE
EVAL_SPLIT_NAMES = ("validation", "val", "test", "eval")
HELD_OUT_EVERY = 10  # without an evaluation split, every 10th example of each class is held out


@dataclasses.dataclass
class Source:
    """One dataset: raw examples of each split and how to decode them.

    `examples(split, index, count)` returns shard `index` of `count` of the
    split, in a fixed order; `decode(raw)` maps a raw example to
    (uint8 or float image HWC in 0..255, int label). `class_names`: the
    class names in label order where the data names them (folders, lists,
    tfds, Keras directory datasets), else None.
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
    class_names: Optional[List[str]] = None

    def shard_size(self, split, index, count):
        total = self.sizes.get(split)
        if total is None:
            return None
        return total // count + (1 if index < total % count else 0)


def _warn(message):
    """Data warnings go to stderr as one line each (the run goes on)."""
    print(f"keras-vit: warning: {message}", file=sys.stderr, flush=True)


# --- sources -----------------------------------------------------------------

# The digits are read in keras_vit.mnist5k; these names stay for callers of the trainer's API.
mnist5k_path = mnist5k.path
read_mnist5k = mnist5k.read
load_mnist5k = mnist5k.split


def _mnist5k_source(config) -> Source:
    (x_train, y_train), (x_test, y_test) = mnist5k.split()
    arrays = {"train": (x_train, y_train), "test": (x_test, y_test)}

    def examples(split, index, count):
        images, labels = arrays[split]
        return tf.data.Dataset.from_tensor_slices((images[index::count], labels[index::count]))

    return Source(
        name="mnist5k", num_classes=10, num_channels=1, image_size=(28, 28),
        sizes={k: len(v[1]) for k, v in arrays.items()}, train_split="train", eval_split="test",
        examples=examples, decode=lambda raw: raw, class_names=[str(i) for i in range(10)],
    )


def _pillow_decoder(channels, from_path):
    """Decodes (file path or encoded bytes, label) with keras_vit.images.decode,
    in the tf.data map (parallel: Pillow decodes without the GIL), so training
    sees the pixels predict, inspect and export see."""

    def decode_value(value):
        return images_lib.decode(os.fsdecode(value) if from_path else value, channels)

    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        value, label = raw
        image = tf.numpy_function(decode_value, [value], tf.uint8, stateful=False)
        image.set_shape([None, None, channels])
        return image, tf.cast(label, tf.int32)

    return decode


def _held_out(files_by_class):
    """Every HELD_OUT_EVERY-th file of each class (in the given order) -> eval; the rest train."""
    train = {c: [f for i, f in enumerate(fs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
             for c, fs in files_by_class.items()}
    held = {c: [f for i, f in enumerate(fs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
            for c, fs in files_by_class.items()}
    return train, held


def _file_source(config, name, classes, train_files, eval_files) -> Source:
    """A Source over image files: {class: [path]} for the train and eval splits."""
    splits = {}
    for split, files in (("train", train_files), ("eval", eval_files)):
        pairs = [(f, i) for i, c in enumerate(classes) for f in files.get(c, [])]
        splits[split] = ([p for p, _ in pairs], np.array([label for _, label in pairs], np.int32))

    def examples(split, index, count):
        paths, labels = splits[split]
        return tf.data.Dataset.from_tensor_slices(
            (tf.constant(paths[index::count], tf.string), labels[index::count]))

    return Source(
        name=name, num_classes=len(classes), num_channels=3, image_size=None,
        sizes={k: len(v[1]) for k, v in splits.items()}, train_split="train", eval_split="eval",
        examples=examples, decode=_pillow_decoder(3, from_path=True), class_names=list(classes),
    )


def _leave_out_unreadable(config, name, files_by_split):
    """Decodes every file once before training (cached); the ones that fail
    are named in one warning and left out (an error with --strict-data)."""
    paths = [f for files in files_by_split for fs in files.values() for f in fs]
    bad = images_lib.find_unreadable(paths, description=f"Checking {len(paths)} images",
                                     progress=config.progress)
    if not bad:
        return files_by_split
    listed = "; ".join(f"{path} ({reason})" for path, reason in bad)
    message = f"{name}: {len(bad)} of {len(paths)} image files cannot be decoded: {listed}"
    if config.strict_data:
        raise ValueError(f"{message}. Remove or repair them, or drop --strict-data to leave them out.")
    _warn(f"{message}. They are left out (pass --strict-data to stop instead).")
    bad_paths = {os.path.abspath(p) for p, _ in bad}
    return [{c: [f for f in fs if os.path.abspath(f) not in bad_paths] for c, fs in files.items()}
            for files in files_by_split]


def _check_classes(config, name, classes, train_files, where):
    """An empty class is an error naming it (or dropped, --drop-empty-classes); one class warns."""
    empty = [c for c in classes if not train_files.get(c)]
    if empty:
        listed = ", ".join(os.path.join(where, c) for c in empty)
        if not config.drop_empty_classes:
            raise ValueError(f"{name}: {len(empty)} class folder(s) hold no readable images: {listed}. Add "
                             f"images, remove the folder(s), or pass --drop-empty-classes to leave them out.")
        _warn(f"{name}: dropping {len(empty)} empty class folder(s): {listed}.")
        classes = [c for c in classes if c not in empty]
    if not classes:
        raise ValueError(f"{name} holds no class sub-folders with images ({', '.join(images_lib.IMAGE_EXTENSIONS)}).")
    if len(classes) == 1:
        _warn(f"{name} has a single class ({classes[0]!r}): a classifier has nothing to tell apart "
              f"(degenerate data).")
    return classes


def _class_folders(directory):
    return sorted(d for d in os.listdir(directory)
                  if os.path.isdir(os.path.join(directory, d)) and not d.startswith("."))


def _folder_source(config, root) -> Source:
    if not os.path.isdir(root):
        raise ValueError(f"folder:{root}: no such directory.")
    name = f"folder:{root}"
    train_dir = os.path.join(root, "train")
    eval_dir = next((os.path.join(root, n) for n in EVAL_SPLIT_NAMES if os.path.isdir(os.path.join(root, n))), None)

    def listing(directory):
        classes = _class_folders(directory)
        return classes, {c: images_lib.list_images(os.path.join(directory, c)) for c in classes}

    if os.path.isdir(train_dir) and eval_dir:
        classes, train_files = listing(train_dir)
        eval_classes, eval_files = listing(eval_dir)
        if eval_classes != classes:
            raise ValueError(f"{name}: train/ and {os.path.basename(eval_dir)}/ have different classes.")
        train_files, eval_files = _leave_out_unreadable(config, name, [train_files, eval_files])
        where = train_dir
    else:
        classes, all_files = listing(root)
        (all_files,) = _leave_out_unreadable(config, name, [all_files])
        train_files, eval_files = _held_out(all_files)
        where = root
    classes = _check_classes(config, name, classes, train_files, where)
    return _file_source(config, name, classes, train_files, eval_files)


def _read_list(path):
    """(path, label) rows of a CSV (optional header) or JSON list file; paths relative to the file."""
    import csv
    import json

    if not os.path.isfile(path):
        raise ValueError(f"list:{path}: no such file (a CSV or JSON list of image path, label).")
    with open(path, encoding="utf-8") as f:
        if path.lower().endswith(".json"):
            rows = json.load(f)
            rows = [(r["path"], r["label"]) if isinstance(r, dict) else tuple(r) for r in rows]
        else:
            rows = [tuple(r) for r in csv.reader(f) if r and any(cell.strip() for cell in r)]
            if rows and rows[0][0].strip().lower() in ("path", "file", "filename", "image"):
                rows = rows[1:]
    base = os.path.dirname(os.path.abspath(path))
    try:
        return [(os.path.join(base, str(p).strip()), str(label).strip()) for p, label in rows]
    except ValueError:
        raise ValueError(f"list:{path}: every row must be (path, label).") from None


def _list_classes(labels):
    """Class names in label order: integers keep their values (0..max), names are sorted."""
    if labels and all(label.lstrip("-").isdigit() for label in labels):
        return [str(i) for i in range(max(int(label) for label in labels) + 1)]
    return sorted(set(labels))


def _list_source(config, spec) -> Source:
    """list:TRAIN[,EVAL]: CSV/JSON lists of (image path, label); without EVAL, every
    10th image of each class is held out."""
    name = f"list:{spec}"
    files = spec.split(",")
    if len(files) > 2:
        raise ValueError(f"{name}: give list:TRAIN or list:TRAIN,EVAL.")
    rows = [_read_list(f) for f in files]
    classes = _list_classes([label for table in rows for _, label in table])

    def by_class(table):
        grouped = {c: [] for c in classes}
        for p, label in table:
            grouped[str(int(label)) if label.lstrip("-").isdigit() else label].append(p)
        return grouped

    if len(rows) == 2:
        train_files, eval_files = _leave_out_unreadable(config, name, [by_class(rows[0]), by_class(rows[1])])
    else:
        (all_files,) = _leave_out_unreadable(config, name, [by_class(rows[0])])
        train_files, eval_files = _held_out(all_files)
    empty = [c for c in classes if not train_files[c]]
    if empty and not config.drop_empty_classes:
        raise ValueError(f"{name}: class(es) {', '.join(empty)} have no readable training images; fix the list "
                         f"or pass --drop-empty-classes.")
    if empty:
        _warn(f"{name}: dropping class(es) without images: {', '.join(empty)}.")
    classes = [c for c in classes if c not in empty]
    return _file_source(config, name, classes, train_files, eval_files)


def _tfrecord_source(config, root) -> Source:
    train_files = sorted(glob.glob(os.path.join(root, "train*.tfrecord*")))
    eval_files = []
    for name in EVAL_SPLIT_NAMES:
        eval_files = sorted(glob.glob(os.path.join(root, f"{name}*.tfrecord*")))
        if eval_files:
            break
    if not train_files or not eval_files:
        raise ValueError(f"tfrecord:{root} needs train*.tfrecord* and one of "
                         f"{'/'.join(EVAL_SPLIT_NAMES)}*.tfrecord* files.")
    num_classes = config.num_classes
    class_names = None
    labels_txt = os.path.join(root, "labels.txt")
    if os.path.exists(labels_txt):
        with open(labels_txt, encoding="utf-8") as f:
            class_names = [line.strip() for line in f if line.strip()]
    if num_classes is None and class_names:
        num_classes = len(class_names)
    if num_classes is None:
        raise ValueError(f"tfrecord:{root}: pass --num-classes (or write {labels_txt}, one class a line).")
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    files = {"train": train_files, "eval": eval_files}

    def examples(split, index, count):
        ds = tf.data.TFRecordDataset(files[split])
        return ds.shard(count, index).map(
            lambda r: (lambda e: (e["image"], e["label"]))(tf.io.parse_single_example(r, features)))

    # The evaluation split is counted once: every worker must run as many eval steps.
    eval_size = int(tf.data.TFRecordDataset(eval_files).reduce(np.int64(0), lambda n, _: n + 1))
    return Source(
        name=f"tfrecord:{root}", num_classes=int(num_classes), num_channels=3, image_size=None,
        sizes={"train": None, "eval": eval_size}, train_split="train", eval_split="eval",
        examples=examples, decode=_pillow_decoder(3, from_path=False),
        class_names=class_names if class_names and len(class_names) == int(num_classes) else None,
    )


def _tfds_builder(config, name):
    """A prepared tfds builder: NAME[/CONFIG][:VERSION] in --data-dir, or a prepared
    dataset directory (.../NAME/VERSION). Never downloads: an unprepared dataset
    is an error that says how to prepare it."""
    import tensorflow_datasets as tfds

    if os.path.isdir(name):
        try:
            return tfds.builder_from_directory(name)
        except Exception as error:  # noqa: BLE001 - whatever tfds raises, say what the folder must be
            raise ValueError(f"tfds:{name}: not a prepared tfds dataset directory (it needs the dataset_info.json "
                             f"that download_and_prepare writes, e.g. DATA_DIR/NAME/1.0.0): {error}") from None
    try:
        builder = tfds.builder(name, data_dir=config.data_dir)
    except Exception as error:  # noqa: BLE001 - unknown names, bad configs
        raise ValueError(f"tfds:{name}: {type(error).__name__}: {str(error).splitlines()[0]}") from None
    if not builder.is_prepared():
        raise ValueError(
            f"tfds:{name} is not prepared in {builder.data_dir}; training never downloads. Prepare it once on a "
            f"machine with network access: python -c \"import tensorflow_datasets as tfds; "
            f"tfds.builder('{name}', data_dir='DATA_DIR').download_and_prepare()\", then pass --data-dir DATA_DIR "
            f"(or tfds:DATA_DIR/NAME/VERSION).")
    return builder


def _tfds_source(config, name) -> Source:
    import tensorflow_datasets as tfds

    builder = _tfds_builder(config, name)
    info = builder.info
    image_key = "image" if "image" in info.features else next(
        k for k, v in info.features.items() if isinstance(v, tfds.features.Image))
    label_key = "label"
    splits = list(info.splits)
    eval_split = config.eval_split or next((s for s in ("validation", "test") if s in splits), None)
    if eval_split is None or config.train_split not in splits:
        raise ValueError(f"tfds:{name} has splits {splits}; pass --train-split/--eval-split.")
    shape = info.features[image_key].shape
    channels = shape[-1] or 3
    size = tuple(shape[:2]) if None not in shape[:2] else None
    label_feature = info.features[label_key]

    def examples(split, index, count):
        # even_splits reads only this worker's part of the files.
        sub = tfds.even_splits(split, n=count)[index] if count > 1 else split
        ds = builder.as_dataset(split=sub, shuffle_files=False,
                                decoders={image_key: tfds.decode.SkipDecoding()})
        return ds.map(lambda e: (e[image_key], e[label_key]))

    return Source(
        name=f"tfds:{name}", num_classes=label_feature.num_classes, num_channels=channels,
        image_size=size, sizes={s: info.splits[s].num_examples for s in splits},
        train_split=config.train_split, eval_split=eval_split, examples=examples,
        decode=_pillow_decoder(channels, from_path=False), class_names=list(label_feature.names),
    )


def _object_source(config, dataset) -> Source:
    """train(config, dataset=...): see open_source."""
    if isinstance(dataset, (tuple, list)):
        if len(dataset) != 2:
            raise ValueError("dataset= takes a tf.data.Dataset of (image, label), a (train, eval) pair of them, "
                             "or a keras.utils.image_dataset_from_directory dataset.")
        train, held = dataset
    else:
        train, held = dataset, None
    file_paths = getattr(train, "file_paths", None)
    if file_paths is not None and getattr(train, "class_names", None):
        return _keras_directory_source(config, train, held)
    if not isinstance(train, tf.data.Dataset) or (held is not None and not isinstance(held, tf.data.Dataset)):
        raise ValueError(f"dataset= must be a tf.data.Dataset of (image, label), a (train, eval) pair of them, or "
                         f"a keras.utils.image_dataset_from_directory dataset; got {type(train).__name__}.")
    train, held = _examples_of(train), None if held is None else _examples_of(held)
    if held is None:
        # One dataset: every 10th example is held out for evaluation.
        numbered = train.enumerate()
        held = numbered.filter(lambda i, e: i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1).map(lambda i, e: e)
        train = numbered.filter(lambda i, e: i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1).map(lambda i, e: e)
    datasets = {"train": train, "eval": held}
    image_spec = train.element_spec[0]
    if image_spec.shape.rank != 3 or image_spec.shape[-1] is None:
        raise ValueError(f"dataset= elements must be (image (H, W, C), label); got image shape {image_spec.shape}.")
    sizes = {k: int(v.reduce(np.int64(0), lambda n, _: n + 1)) for k, v in datasets.items()}
    class_names = getattr(dataset if not isinstance(dataset, (tuple, list)) else dataset[0], "class_names", None)
    num_classes = config.num_classes or (len(class_names) if class_names else None)
    if num_classes is None:  # one pass over the labels
        num_classes = 1 + max(int(v.map(lambda image, label: tf.cast(label, tf.int64)).reduce(
            np.int64(-1), tf.maximum)) for v in datasets.values())
    size = tuple(image_spec.shape[:2]) if None not in image_spec.shape[:2] else None

    def examples(split, index, count):
        return datasets[split].shard(count, index)

    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        image, label = raw
        return image, tf.cast(label, tf.int32)

    return Source(
        name="dataset", num_classes=int(num_classes), num_channels=int(image_spec.shape[-1]), image_size=size,
        sizes=sizes, train_split="train", eval_split="eval", examples=examples, decode=decode,
        class_names=list(class_names) if class_names else None,
    )


def _examples_of(ds):
    """(image, label) examples of a dataset of tuples or {"image", "label"} dicts, batched or not."""
    spec = ds.element_spec
    if isinstance(spec, dict):
        ds = ds.map(lambda e: (e["image"], e["label"]))
        spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise ValueError(f"dataset= elements must be (image, label) pairs; got {spec}.")
    if spec[0].shape.rank == 4:
        ds = ds.unbatch()
    return ds


def _keras_directory_source(config, train, held) -> Source:
    """A keras.utils.image_dataset_from_directory dataset: its files, re-read by
    keras_vit.images (seeded, resumable order; the pixels predict sees)."""
    classes = list(train.class_names)

    def by_class(ds):
        grouped = {c: [] for c in classes}
        for path in sorted(ds.file_paths):
            parent = os.path.basename(os.path.dirname(path))
            if parent not in grouped:
                raise ValueError(f"dataset=: {path} is not inside a folder named after one of {classes}.")
            grouped[parent].append(path)
        return grouped

    name = "image_dataset_from_directory"
    if held is not None:
        train_files, eval_files = _leave_out_unreadable(config, name, [by_class(train), by_class(held)])
    else:
        (all_files,) = _leave_out_unreadable(config, name, [by_class(train)])
        train_files, eval_files = _held_out(all_files)
    classes = _check_classes(config, name, classes, train_files, "")
    return _file_source(config, name, classes, train_files, eval_files)


def open_source(config, dataset=None) -> Source:
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
        class held out when no validation dataset is given.
    The trainer's stream is a pure function of (seed, examples consumed) only
    when a tf.data.Dataset yields the same elements in the same order on
    every pass (no unseeded shuffle inside it).
    """
    if dataset is not None:
        return _object_source(config, dataset)
    spec = config.dataset
    if spec == "mnist5k":
        return _mnist5k_source(config)
    kind, _, arg = spec.partition(":")
    if kind == "tfds" and arg:
        return _tfds_source(config, arg)
    if kind == "folder" and arg:
        return _folder_source(config, arg)
    if kind == "list" and arg:
        return _list_source(config, arg)
    if kind == "tfrecord" and arg:
        return _tfrecord_source(config, arg)
    raise ValueError(f"Unknown dataset {spec!r}: use mnist5k, tfds:NAME, folder:PATH, list:FILE or tfrecord:DIR.")


# --- preprocessing -------------------------------------------------------------

def _model_channels(image, channels):
    """Decoded pixels -> `channels` by keras_vit.images' rule (integer luma on
    uint8, as PIL's "L"), then float32 0..255."""
    return tf.cast(images_lib.convert_channels(image, channels), tf.float32)


def _inception_crop(image, size, seed):
    # The official code's Inception crop: 5%..100% of the area, aspect 3/4..4/3.
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3), min_object_covered=0.0,
        use_image_if_no_bounding_boxes=True)
    return tf.image.resize(tf.slice(image, begin, crop_size), size)


def _random_affine(image, seed, max_degrees=15.0, max_scale=0.15, max_shift=0.125):
    """Rotation, zoom and shift drawn from `seed`; edges extend outwards."""
    height, width = image.shape[0], image.shape[1]
    u = tf.random.stateless_uniform([4], seed, -1.0, 1.0)
    angle = u[0] * max_degrees * math.pi / 180.0
    scale = 1.0 + u[1] * max_scale
    tx, ty = u[2] * max_shift * width, u[3] * max_shift * height
    cos, sin = tf.cos(angle) / scale, tf.sin(angle) / scale
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    # The map from output to input pixel: rotate/zoom about the centre, then shift.
    transform = tf.stack([cos, sin, cx - cos * (cx + tx) - sin * (cy + ty),
                          -sin, cos, cy + sin * (cx + tx) - cos * (cy + ty), 0.0, 0.0])
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform[None], output_shape=[height, width], fill_value=0.0,
        interpolation="BILINEAR", fill_mode="NEAREST")[0]


def augment(image, size, kind, seed):
    """Training augmentation of a float image in 0..255 -> (size, size, C)."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    if kind.startswith("inception_crop"):
        image = _inception_crop(image, size, seeds[0])
    else:
        image = images_lib.resize(image, size)
    if kind == "affine":
        image = _random_affine(image, seeds[0])
    if kind == "translate":
        # Shift by up to 1/8 of the side: mirror-pad, then crop back at random.
        pad = max(1, size[0] // 8)
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="SYMMETRIC")
        image = tf.image.stateless_random_crop(image, [size[0], size[1], image.shape[-1]], seed=seeds[0])
    if kind.endswith("flip"):
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    return image


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """What the model needs from the data: the resolution and channel count."""

    image_size: Tuple[int, int]
    num_channels: int


def train_dataset(source: Source, pipeline: Pipeline, config, context: tf.distribute.InputContext,
                  examples_seen: int) -> tf.data.Dataset:
    """This input pipeline's endless training stream, from its share of
    `examples_seen` on, in per-replica batches of {"image", "label"}."""
    index, count = context.input_pipeline_id, context.num_input_pipelines
    per_replica = context.get_per_replica_batch_size(config.recipe.batch_size)
    start = examples_seen // count
    shard_size = source.shard_size(source.train_split, index, count)
    if shard_size == 0:
        raise ValueError(f"Input pipeline {index} of {count} has no training examples.")
    start_epoch, offset = divmod(start, shard_size) if shard_size else (0, start)
    raw = source.examples(source.train_split, index, count)
    buffer = max(1, min(config.shuffle_buffer, shard_size or config.shuffle_buffer))
    seed = config.seed * 1_000_003 + index

    @tf.autograph.experimental.do_not_convert
    def epoch(e):
        # Shuffle blocks of `buffer` examples with a stateless permutation
        # seeded by (seed, epoch, block): tf.data's shuffle takes no tensor seed.
        @tf.autograph.experimental.do_not_convert
        def shuffle_block(block_index, block):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(tf.nest.flatten(block)[0])[0]),
                seed=tf.stack([tf.constant(seed, tf.int64), e * 1_000_003 + block_index]))
            return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(lambda t: tf.gather(t, order), block))

        return raw.batch(buffer).enumerate().flat_map(shuffle_block)

    ds = tf.data.Dataset.range(start_epoch, 2**40).flat_map(epoch).skip(offset).enumerate(start)
    size, kind = pipeline.image_size, config.recipe.train_augment

    @tf.autograph.experimental.do_not_convert
    def prepare(i, raw_example):
        image, label = source.decode(raw_example)
        image = _model_channels(image, pipeline.num_channels)
        image = augment(image, size, kind, tf.stack([tf.cast(seed, tf.int64), i]))
        return {"image": images_lib.to_model_range(image), "label": tf.cast(label, tf.int32)}

    ds = ds.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return _finish(ds.batch(per_replica, drop_remainder=True))


def eval_steps(source: Source, global_batch: int) -> int:
    size = source.sizes.get(source.eval_split)
    if not size:
        raise ValueError(f"{source.name}: the evaluation split {source.eval_split!r} is empty or of unknown size.")
    return math.ceil(size / global_batch)


def eval_dataset(source: Source, pipeline: Pipeline, global_batch: int, num_steps: int,
                 context: tf.distribute.InputContext, split: Optional[str] = None) -> tf.data.Dataset:
    """Per-replica batches of {"image", "label", "weight"}: this pipeline's
    share of the split, padded with weight-0 examples so that every worker
    runs exactly `num_steps` steps."""
    index, count = context.input_pipeline_id, context.num_input_pipelines
    per_replica = context.get_per_replica_batch_size(global_batch)
    per_pipeline = num_steps * global_batch // count
    size = pipeline.image_size

    @tf.autograph.experimental.do_not_convert
    def prepare(*raw_example):
        image, label = source.decode(raw_example)
        image = images_lib.resize(_model_channels(image, pipeline.num_channels), size)
        return {"image": images_lib.to_model_range(image), "label": tf.cast(label, tf.int32), "weight": tf.constant(1.0)}

    ds = source.examples(split or source.eval_split, index, count).map(
        prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    padding = tf.data.Dataset.from_tensors({
        "image": tf.zeros([size[0], size[1], pipeline.num_channels]),
        "label": tf.constant(0, tf.int32), "weight": tf.constant(0.0)}).repeat()
    ds = ds.concatenate(padding).take(per_pipeline)
    return _finish(ds.batch(per_replica, drop_remainder=True))


def _finish(ds):
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(AUTOTUNE)


def plain_dataset(source: Source, pipeline: Pipeline, split: str, batch_size: int,
                  limit: Optional[int] = None) -> tf.data.Dataset:
    """The first `limit` examples of a split, resized only, in fixed order (one process)."""
    size = pipeline.image_size

    @tf.autograph.experimental.do_not_convert
    def prepare(*raw_example):
        image, label = source.decode(raw_example)
        image = images_lib.resize(_model_channels(image, pipeline.num_channels), size)
        return {"image": images_lib.to_model_range(image), "label": tf.cast(label, tf.int32)}

    ds = source.examples(split, 0, 1)
    if limit:
        ds = ds.take(limit)
    return _finish(ds.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True).batch(batch_size))
