"""The training stream of one input pipeline: epochs, shuffling, sharding, resume.

Every source says how an epoch of a worker's shard is ordered
(Source.shuffle_kind):

* "permutation": epoch e is a permutation of the worker's whole shard drawn
  from (seed, worker, e); the shuffle buffer plays no part, so a
  class-sorted folder of any size is mixed from the first batch.
* "files" and "buffer": the source orders its files (or keeps the dataset's
  own order), and the stream shuffles blocks of `shuffle_buffer` raw
  examples, each with a stateless permutation from (seed, worker, e,
  block). When the first block holds only a small fraction of the classes,
  one warning says so. Raw examples are encoded bytes, pixels of one size,
  or serialized tensors (sources/objects.py), so a block always batches.

The position in the stream is one number (examples consumed by this
pipeline) that a checkpoint stores and a resumed run skips to; every
example is numbered by it, and its augmentation is seeded by that number,
hence identical however many decode threads run and however often the run
restarts.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from keras_vit.utils import console as _console
from keras_vit.errors import UserError
from keras_vit.utils.console import warn

FEW_CLASSES = 0.5  # warn when the first shuffle block of a stream holds less than this fraction of the classes


def pipeline_seed(run_seed: int, index: int) -> int:
    """The seed of input pipeline `index`'s shuffling and augmentation."""
    return run_seed * 1_000_003 + index


def numbered(source, index, count, run_seed, shuffle_buffer, repeats, start) -> tf.data.Dataset:
    """(position, raw example) of pipeline `index` of `count`, endless, from
    position `start` on; with `repeats` K > 1 each example comes K times in a
    row (repeated augmentation)."""
    shard_size = source.shard_size(source.train_split, index, count)
    if shard_size == 0:
        raise UserError(f"Input pipeline {index} of {count} has no training examples: give each worker data.")
    start_epoch, offset = divmod(start, shard_size) if shard_size else (0, start)
    ordered = _epochs(source, index, count, run_seed, pipeline_seed(run_seed, index), shuffle_buffer, shard_size,
                      repeats)
    return tf.data.Dataset.range(start_epoch, 2**40).flat_map(ordered).skip(offset).enumerate(start)


def _epochs(source, index, count, run_seed, worker_seed, shuffle_buffer, shard_size, repeats=1):
    """epoch e -> the raw examples of this shard in epoch e's order (see the
    module docstring); with `repeats` K > 1 each example comes K times in a
    row (repeated augmentation, timm's RepeatAugSampler) and the epoch keeps
    its length: the first 1/K of the order, each K times."""

    @tf.autograph.experimental.do_not_convert
    def epoch(e):
        ordered = shuffled(e)
        if repeats == 1:
            return ordered
        ordered = ordered.flat_map(lambda *raw: tf.data.Dataset.from_tensors(raw).repeat(repeats))
        return ordered.take(shard_size) if shard_size else ordered

    @tf.autograph.experimental.do_not_convert
    def shuffled(e):
        raw = source.epoch(source.train_split, index, count, tf.stack([tf.constant(run_seed, tf.int64), e]))
        if source.shuffle_kind == "permutation":
            return raw
        buffer = max(1, min(shuffle_buffer, shard_size or shuffle_buffer))

        # Blocks of `buffer` examples, each shuffled with a stateless
        # permutation from (seed, epoch, block): tf.data's shuffle takes no tensor seed.
        @tf.autograph.experimental.do_not_convert
        def shuffle_block(block_index, block):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(tf.nest.flatten(block)[0])[0]),
                seed=tf.stack([tf.constant(worker_seed, tf.int64), e * 1_000_003 + block_index]))
            return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(lambda t: tf.gather(t, order), block))

        return raw.batch(buffer).enumerate().flat_map(shuffle_block)

    return epoch


def check_stream_mixing(source, config) -> Optional[str]:
    """For a stream (not addressable by index): one warning when the first
    shuffle block of epoch 0 holds less than FEW_CLASSES of the classes, i.e.
    the data is stored in class order and early batches are no sample of it.
    Reads the labels of that block only. Returns the warning, if any."""
    if source.shuffle_kind == "permutation" or not source.num_classes or source.num_classes < 2:
        return None
    shard_size = source.shard_size(source.train_split, 0, 1)
    buffer = max(1, min(config.shuffle_buffer, shard_size or config.shuffle_buffer))
    first = source.epoch(source.train_split, 0, 1, tf.constant([config.seed, 0], tf.int64)).take(buffer)
    labels = np.concatenate([np.ravel(b) for b in first.map(lambda *raw: raw[-1]).batch(4096).as_numpy_iterator()])
    seen = len(np.unique(labels))
    if seen >= FEW_CLASSES * source.num_classes:
        return None
    message = (f"{source.name}: the first {len(labels):,} examples of the training stream (one shuffle block) hold "
               f"only {seen} of its {source.num_classes} classes: the records are stored in class order, so early "
               f"batches are no sample of the data. Spread the classes over more files (or write them shuffled), "
               f"or raise {_console.either('--shuffle-buffer', 'shuffle_buffer')}.")
    warn(message)
    return message


