"""The trainer's datasets, read off the run's plan: training, evaluation, few-shot.

    source = open_source(config)                   # keras_vit.training.sources
    plan = keras_vit.training.plan.resolve(config, source)
    train_dataset(source, plan, context, examples_seen)

Three jobs, three modules: `sources` (where examples come from and how they
decode), `stream` (epochs, shuffling, sharding and the position a resume
skips to) and `augment` (the training ops, built from the plan's op list).
This module puts them together into per-replica batches of the Task's
fields (plan.fields: "image", "label", a "mask", ...; keras_vit.tasks.fields)
and "weight" (0 for an example that failed to decode).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.errors import UserError
from keras_vit.tasks import fields as fields_lib
from keras_vit.training import augment as augment_lib
from keras_vit.training import stream as stream_lib
# The data API callers know by this module's name.
from keras_vit.training.sources import (  # noqa: F401
    HELD_OUT_EVERY, Source, load_mnist5k, mnist5k_path, open_source, read_mnist5k, strict_failure,
    warn)
from keras_vit.training.stream import check_stream_mixing  # noqa: F401

__all__ = ["HELD_OUT_EVERY", "Source", "check_stream_mixing", "eval_dataset", "load_mnist5k",
           "mnist5k_path", "model_pixels", "open_source", "plain_dataset", "read_mnist5k",
           "strict_failure", "train_dataset", "warn"]

AUTOTUNE = tf.data.AUTOTUNE


def model_pixels(image, channels):
    """Decoded pixels -> `channels` by keras_vit.images' rule (integer luma on
    uint8, as PIL's "L"), then float32 0..255."""
    return tf.cast(images_lib.convert_channels(image, channels), tf.float32)


def train_dataset(source: Source, plan, context: tf.distribute.InputContext, examples_seen: int) -> tf.data.Dataset:
    """This input pipeline's endless training stream, from its share of
    `examples_seen` on, in per-replica batches.

    Mixup/CutMix mixes groups of 2K consecutive examples of the stream (K the
    repeated-augmentation count), numbered from the stream's start: the
    stream is opened at the first example of the group holding the resume
    position, mixed, then skipped to that position. So any batch size works,
    a group may span two batches, and a resume anywhere mixes as the
    uninterrupted run did."""
    index, count = context.input_pipeline_id, context.num_input_pipelines
    start = examples_seen // count
    group = 2 * plan.mixing["partner_offset"] if plan.mixing else 1
    first = start - start % group
    config = plan.config
    seed = stream_lib.pipeline_seed(config.seed, index)
    ds = stream_lib.numbered(source, index, count, config.seed, config.shuffle_buffer,
                             plan.recipe.repeated_augmentation, first)
    transform = augment_lib.fields_transform(plan)

    @tf.autograph.experimental.do_not_convert
    def prepare(i, raw_example):
        example, ok = _decoded(source, plan, raw_example, plan.fields)
        example = plan.task.encode(transform(example, tf.stack([tf.cast(seed, tf.int64), i])))
        example["weight"] = tf.cast(ok, tf.float32)
        if plan.mixing:
            example["position"] = i  # seeds its group's mixing; dropped once mixed
        return example

    ds = ds.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    if plan.mixing:
        ds = _mixed(ds, plan, seed, group).skip(start - first)
    return _finish(ds.batch(plan.per_replica_batch, drop_remainder=True))


def _mixed(ds, plan, seed, group_size):
    mix = augment_lib.group_mixer(plan)

    @tf.autograph.experimental.do_not_convert
    def mixed(group):
        group_seed = augment_lib.fold(tf.stack([tf.cast(seed, tf.int64), group["position"][0] // group_size]), 3)
        return {k: v for k, v in mix(group, group_seed).items() if k != "position"}

    return ds.batch(group_size, drop_remainder=True).map(mixed, num_parallel_calls=AUTOTUNE,
                                                         deterministic=True).unbatch()


def _decoded(source, plan, raw_example, fields):
    """(the example's `fields` as decoded, the image in float 0..255 of the plan's channels; ok)."""
    decoded, ok = source.decode(raw_example)
    example = {name: decoded[name] for name in fields}
    example["image"] = model_pixels(example["image"], plan.num_channels)
    return example, ok


def _resized(source, plan, fields):
    """Evaluation's and few-shot's decoding: resized only (masks and depth maps nearest), scaled as
    the model takes it (augment.resize_transform)."""
    transform = augment_lib.resize_transform(plan, fields)

    @tf.autograph.experimental.do_not_convert
    def prepare(*raw_example):
        example, ok = _decoded(source, plan, raw_example, fields)
        return transform(example), ok

    return prepare


def eval_dataset(source: Source, plan, num_steps: int, context: tf.distribute.InputContext,
                 split: Optional[str] = None) -> tf.data.Dataset:
    """Per-replica batches of the Task's fields and "weight": this pipeline's
    share of the split, resized only, padded with weight-0 examples so that
    every worker runs exactly `num_steps` steps of plan.eval_batch."""
    index, count = context.input_pipeline_id, context.num_input_pipelines
    per_replica = plan.eval_batch // plan.num_replicas
    per_pipeline = num_steps * plan.eval_batch // count
    size, resized = plan.image_size, _resized(source, plan, plan.fields)

    @tf.autograph.experimental.do_not_convert
    def prepare(*raw_example):
        example, ok = resized(*raw_example)
        return {**plan.task.encode(example), "weight": tf.cast(ok, tf.float32)}

    ds = source.examples(split or source.eval_split, index, count).map(
        prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    blank = {name: kind.blank(size, plan.num_channels) for name, kind in plan.fields.items()}
    padding = tf.data.Dataset.from_tensors({**blank, "weight": tf.constant(0.0)}).map(
        tf.autograph.experimental.do_not_convert(plan.task.encode)).repeat()
    ds = ds.concatenate(padding).take(per_pipeline)
    return _finish(ds.batch(per_replica, drop_remainder=True))


@tf.autograph.experimental.do_not_convert
def _first(a, b):
    return a


@tf.autograph.experimental.do_not_convert
def _second(a, b):
    return b


def _finish(ds):
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # Each op of the pipeline (a decode, a resize) on one thread: its parallelism is across examples
    # (num_parallel_calls), and an op that split itself over the intra-op pool would take threads
    # from the training step's kernels. On 2 cores that was 1.5% of every step of S/16 (0.982x of
    # `fit` with JPEGs, 0.997x without the split; benchmarks/results_trainer_loop.md).
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options).prefetch(AUTOTUNE)


def plain_dataset(source: Source, plan, split: str, batch_size: int, limit: Optional[int] = None) -> tf.data.Dataset:
    """The first `limit` examples of a split, resized only, in fixed order (one process):
    {"image", "label"} whatever the Task (the few-shot probe reads the labels)."""
    ds = source.examples(split, 0, 1)
    if limit:
        ds = ds.take(limit)
    ds = ds.map(_resized(source, plan, fields_lib.CLASSIFICATION_FIELDS), num_parallel_calls=AUTOTUNE,
                deterministic=True)
    # Few-shot features: an image that failed to decode is simply left out.
    return _finish(ds.filter(_second).map(_first).batch(batch_size))
