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

Class checks are one rule for every source of classes (`files._check_classes`):
no class is an error, an empty class an error (or dropped with
--drop-empty-classes, where its label can go), one class a warning.

One module a kind: `source` (the Source, its table of rows, the Pillow decoder
and the per-source count of undecodable files), `mnist`, `files` (folder:,
list:, Keras directory datasets), `fielded` (list: with columns of more
fields: masks, depth maps, texts), `records` (tfrecord:, tfds:), `objects`
(datasets and arrays handed to train()). `open_source` picks one.
"""

from __future__ import annotations

import os

from keras_vit.utils.console import warn  # noqa: F401  (data warnings: the one keras-vit warning line)
from keras_vit.errors import UserError
from keras_vit.training.sources.fielded import fielded_list_source, is_fielded
from keras_vit.training.sources.files import folder_source, list_source
from keras_vit.training.sources.mnist import load_mnist5k, mnist5k_path, mnist5k_source, read_mnist5k  # noqa: F401
from keras_vit.training.sources.objects import object_source
from keras_vit.training.sources.records import tfds_source, tfrecord_source
from keras_vit.training.sources.source import (  # noqa: F401
    EVAL_SPLIT_NAMES, HELD_OUT_EVERY, DecodeProblems, Source, strict_failure)


def open_source(config, dataset=None, shard=(0, 1), fields=None) -> Source:
    """The Source named by config.dataset, or made from `dataset` when given.

    `dataset` (train(config, dataset=...)) is one of:
      * a tf.data.Dataset of (image HWC 0..255, label) pairs or {"image",
        "label"} dicts, or dicts of more named fields (a "mask" (H, W), a
        "text", ...: those the Task reads are kept), batched or not: every 10th example is held out for
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
    `fields`: the Task's ({name: keras_vit.tasks.fields.FieldKind}): a list:
    whose header names more columns than the image and its label gives them
    (sources/fielded.py). `shard` is (this input pipeline, number of pipelines): with several, the
    files are not checked before training (each worker meets its own).
    The trainer's stream is a pure function of (seed, examples consumed) only
    when a tf.data.Dataset yields the same elements in the same order on
    every pass (no unseeded shuffle inside it).
    """
    if dataset is not None:
        return object_source(config, dataset, shard, fields)
    spec = config.dataset
    if spec == "mnist5k":
        return mnist5k_source(config)
    kind, _, arg = spec.partition(":")
    # The shell expands ~ only at the start of a word: folder:~/photos reaches us as typed.
    arg = os.path.expanduser(arg) if kind in ("folder", "list", "tfrecord") else arg
    if kind == "tfds" and arg:
        return tfds_source(config, arg)
    if kind == "folder" and arg:
        return folder_source(config, arg, shard)
    if kind == "list" and arg:
        if is_fielded(arg.split(",")[0], fields or {}):
            return fielded_list_source(config, arg, fields or {})
        return list_source(config, arg, shard)
    if kind == "tfrecord" and arg:
        return tfrecord_source(config, arg, fields)
    if kind == "captions" and arg:
        from keras_vit.training.sources.captions import captions_source

        return captions_source(config, os.path.expanduser(arg), fields or {})
    if kind in ("masks", "depth") and arg:
        from keras_vit.training.sources.maps import maps_source

        return maps_source(config, kind, arg, fields or {})
    raise UserError(f"Unknown dataset {spec!r}: use mnist5k, tfds:NAME, folder:PATH, list:FILE, tfrecord:DIR, "
                    f"captions:FILE, masks:DIR or depth:DIR.")
