"""The 5,000 MNIST digits shipped inside this package: the one reader.

The trainer's `mnist5k` dataset, `keras-vit demo` and `keras-vit export --data
mnist` all read them here, so the split they share is defined once. Numpy
only: importing this module starts neither TensorFlow nor Keras.

The file is keras_vit/data/mnist5k.npz; its source and licence are stated in
keras_vit/data/README.md.
"""

from __future__ import annotations

import functools
import os

import numpy as np

TEST_SIZE = 1000  # held out once, by a fixed permutation (seed 0)


def path() -> str:
    """Where the digits are: keras_vit/data/mnist5k.npz, next to this module."""
    # A plain path rather than importlib.resources: the package is always
    # installed as files (setup.cfg has zip_safe = False), and callers print it.
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist5k.npz")


@functools.lru_cache(maxsize=1)
def _arrays():
    try:
        with np.load(path()) as archive:
            images, labels = archive["images"], archive["labels"]
    except FileNotFoundError as error:  # an install that left out package data: ours to fix
        raise RuntimeError(f"The bundled MNIST digits are missing from the installed package ({path()}); "
                           "reinstall keras-vision-transformer.") from error
    images = images.reshape(-1, 28, 28, 1)
    labels = labels.astype(np.int32)
    # Shared by every caller through the cache: nobody may change them in place.
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def read():
    """(images uint8 (5000, 28, 28, 1), labels int32) in file order (500 per
    class, sorted by class). Fresh copies: the caller may change them."""
    images, labels = _arrays()
    return images.copy(), labels.copy()


def split(test_size: int = TEST_SIZE):
    """((train_images, train_labels), (test_images, test_labels)): the digits
    split once by a fixed permutation (seed 0)."""
    images, labels = read()
    order = np.random.default_rng(0).permutation(len(labels))
    test, train = order[:test_size], order[test_size:]
    return (images[train], labels[train]), (images[test], labels[test])
