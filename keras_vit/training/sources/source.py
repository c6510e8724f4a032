"""A Source and what every kind of source shares: the table of in-memory rows, the
decoder of image files and encoded images (Pillow, as predict decodes), and the count of
the files that failed to decode (DecodeProblems, one per source)."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.utils.console import warn
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
    `decode(raw)` maps a raw example to ({field: value}, whether it decoded):
    "image" uint8 or float HWC in 0..255, "label" int32, and each further
    field the source has (`fields`, the names; keras_vit.tasks.fields says
    what each kind holds). `class_names`: the class names in label
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
    fields: Tuple[str, ...] = ("image", "label")  # what decode gives each example
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


def table_source(splits: dict, **fields) -> Source:
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


@tf.autograph.experimental.do_not_convert
def decoded(raw):
    """decode() of sources whose raw examples are pixels already."""
    image, label = raw
    return {"image": image, "label": tf.cast(label, tf.int32)}, tf.constant(True)


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


def pillow_decoder(channels, from_path, name, strict, problems: DecodeProblems):
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
        return {"image": image, "label": tf.cast(label, tf.int32)}, ok

    return decode
