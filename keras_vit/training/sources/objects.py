"""Data handed to train() as objects: a tf.data.Dataset (or a (train, eval) pair),
numpy arrays, a Keras directory dataset (its files: keras_vit.training.sources.files)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from keras_vit.errors import UserError
from keras_vit.training.sources.files import keras_directory_source
from keras_vit.training.sources.source import HELD_OUT_EVERY, Source, decoded, table_source


# Named, not lambdas: AutoGraph cannot tell two lambdas on one line apart and
# says so in a warning to the user.
def _is_held_out(index, example):
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def _is_kept(index, example):
    return index % HELD_OUT_EVERY != HELD_OUT_EVERY - 1


def _unnumbered(index, example):
    return example


def object_source(config, dataset, shard, fields=None) -> Source:
    """train(config, dataset=...): see open_source. `fields`: the Task's; a dataset of dicts
    with keys beyond "image" and "label" gives them (`_fields_source`)."""
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
        return keras_directory_source(config, train, held, shard)
    if not isinstance(train, tf.data.Dataset) or (held is not None and not isinstance(held, tf.data.Dataset)):
        raise UserError(f"dataset= must be a tf.data.Dataset of (image, label), a (train, eval) pair of them, or "
                        f"a keras.utils.image_dataset_from_directory dataset; got {type(train).__name__}.")
    spec = train.element_spec
    if isinstance(spec, dict) and set(spec) - {"image", "label"}:
        return _fields_source(config, train, held, fields or {})
    datasets = _splits(_examples_of(train), None if held is None else _examples_of(held))
    image_spec = datasets["train"].element_spec[0]
    if image_spec.shape.rank != 3 or image_spec.shape[-1] is None:
        raise UserError(f"dataset= elements must be (image (H, W, C), label); got image shape {image_spec.shape}.")
    class_names = getattr(dataset if not isinstance(dataset, (tuple, list)) else dataset[0], "class_names", None)
    num_classes = config.num_classes or (len(class_names) if class_names else None)
    if num_classes is None:  # one pass over the labels
        num_classes = _classes_by_largest_label(datasets, 1)
    # Images of varying sizes travel as serialized tensors (one string each),
    # so that the stream's shuffle blocks can batch them.
    fixed = None not in image_spec.shape[:2]
    raw_of, decode = (_as_is, decoded) if fixed else (_serialized, _parsed(image_spec))
    return _dataset_source(datasets, raw_of, decode, num_classes, image_spec,
                           class_names=list(class_names) if class_names else None)


def _splits(train, held):
    """{"train", "eval"}: `held` as the evaluation split, else every 10th example of `train`."""
    if held is None:
        numbered = train.enumerate()
        held = numbered.filter(_is_held_out).map(_unnumbered)
        train = numbered.filter(_is_kept).map(_unnumbered)
    return {"train": train, "eval": held}


def _classes_by_largest_label(datasets, label_at: int) -> int:
    """1 + the largest label of rows' column `label_at` over every split (one pass)."""
    @tf.autograph.experimental.do_not_convert
    def label(*row):
        return tf.cast(row[label_at], tf.int64)

    return 1 + max(int(v.map(label).reduce(np.int64(-1), tf.maximum)) for v in datasets.values())


def _dataset_source(datasets, raw_of, decode, num_classes, image_spec, **fields) -> Source:
    """The Source of tf.data datasets {split: rows}. Not addressable by index: each epoch is the
    dataset's own order, shuffled in blocks."""
    def examples(split, index, count):
        return datasets[split].shard(count, index).map(raw_of)

    size = tuple(image_spec.shape[:2]) if None not in image_spec.shape[:2] else None
    return Source(
        name="dataset", num_classes=int(num_classes), num_channels=int(image_spec.shape[-1]), image_size=size,
        sizes={k: int(v.reduce(np.int64(0), lambda n, _: n + 1)) for k, v in datasets.items()},
        train_split="train", eval_split="eval", examples=examples, decode=decode,
        epoch=lambda split, index, count, seed: examples(split, index, count), shuffle_kind="buffer", **fields)


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
        return {"image": image, "label": tf.cast(label, tf.int32)}, tf.constant(True)

    return decode


def _array_source(config, images, labels) -> Source:
    """dataset=(images (N, H, W, C) 0..255, labels (N,)): every 10th example held out."""
    if images.ndim != 4 or labels.shape != (len(images),):
        raise UserError(f"dataset=(images, labels) needs images (N, H, W, C) and labels (N,); got "
                        f"{images.shape} and {labels.shape}.")
    held = np.arange(len(labels)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    labels = labels.astype(np.int32)
    return table_source(
        {"train": (images[~held], labels[~held]), "eval": (images[held], labels[held])},
        name="arrays", num_classes=int(config.num_classes or labels.max() + 1), num_channels=int(images.shape[-1]),
        image_size=tuple(images.shape[1:3]), train_split="train", eval_split="eval", decode=decoded)


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


def _fields_source(config, train, held, kinds) -> Source:
    """A tf.data.Dataset of dicts of named fields ({"image", "mask"}, {"image", "label", "text"},
    ...), batched or not: the fields the Task reads (`kinds`) are kept; every 10th example
    held out without `held`. Images of one size travel as they are; of varying sizes, each
    spatial field as a serialized tensor (so that the stream's shuffle blocks batch)."""
    if "image" not in train.element_spec:
        raise UserError(f"dataset= dicts need an \"image\"; these have {', '.join(train.element_spec)}.")
    order = ["image"] + [k for k in train.element_spec if k != "image" and (k in kinds or k == "label")]

    def rows(ds):
        if ds.element_spec["image"].shape.rank == 4:
            ds = ds.unbatch()
        return ds.map(tf.autograph.experimental.do_not_convert(lambda e: tuple(e[k] for k in order)))

    datasets = _splits(rows(train), None if held is None else rows(held))
    specs = dict(zip(order, datasets["train"].element_spec))
    image_spec = specs["image"]
    if image_spec.shape.rank != 3 or image_spec.shape[-1] is None:
        raise UserError(f"dataset= \"image\" must be (H, W, C); got shape {image_spec.shape}.")
    size = tuple(image_spec.shape[:2]) if None not in image_spec.shape[:2] else None
    spatial = [i for i, k in enumerate(order) if specs[k].shape.rank and specs[k].shape.rank >= 2]
    if "label" in order:
        label_at = order.index("label")
        num_classes = config.num_classes or _classes_by_largest_label(datasets, label_at)
    elif config.num_classes:
        num_classes = config.num_classes
    else:
        raise UserError("dataset= dicts without a \"label\": give num_classes=N (for masks, the class ids "
                        "run 0..N-1).")

    @tf.autograph.experimental.do_not_convert
    def raw_of(*row):  # varying sizes: the spatial fields serialized
        return tuple(tf.io.serialize_tensor(v) if i in spatial and size is None else v for i, v in enumerate(row))

    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        example, ok = {}, tf.constant(True)
        for i, name in enumerate(order):
            value = raw[i]
            if i in spatial and size is None:
                value = tf.io.parse_tensor(value, specs[name].dtype)
                value.set_shape([None] * specs[name].shape.rank)
            if name == "image":
                value.set_shape([None, None, image_spec.shape[-1]])
            elif i in spatial:  # a map of another size than its image: a blank one, and the example weighs nothing
                kind = kinds[name]
                value = value[..., 0] if value.shape.rank == 3 else value  # (H, W, 1) as (H, W)
                fits = tf.reduce_all(tf.shape(value)[:2] == tf.shape(example["image"])[:2])
                ok = ok & fits
                value = tf.cast(value, kind.dtype)
                blank = tf.cast(kind.fill, kind.dtype)
                value = tf.cond(fits, lambda v=value: v, lambda b=blank: tf.fill(tf.shape(example["image"])[:2], b))
            elif name in kinds and kinds[name].dtype != tf.string:
                value = tf.cast(value, kinds[name].dtype)
            example[name] = tf.cast(value, tf.int32) if name == "label" else value
        return example, ok

    return _dataset_source(datasets, raw_of, decode, num_classes, image_spec, fields=tuple(order))
