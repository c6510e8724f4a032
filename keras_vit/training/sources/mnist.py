"""mnist5k: the 5,000 digits inside the package, as a Source."""

from __future__ import annotations


from keras_vit.data import mnist5k
from keras_vit.training.sources.source import Source, decoded, table_source


# --- sources -----------------------------------------------------------------

# The digits are read in keras_vit.data.mnist5k; these names stay for callers of the trainer's API.
mnist5k_path = mnist5k.path


read_mnist5k = mnist5k.read


load_mnist5k = mnist5k.split


def mnist5k_source(config) -> Source:
    (x_train, y_train), (x_test, y_test) = mnist5k.split()
    return table_source(
        {"train": (x_train, y_train), "test": (x_test, y_test)},
        name="mnist5k", num_classes=10, num_channels=1, image_size=(28, 28), train_split="train",
        eval_split="test", decode=decoded, class_names=[str(i) for i in range(10)])
