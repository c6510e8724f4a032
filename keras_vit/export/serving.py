"""The computation every artifact ships: pixels 0..255 in, class probabilities out.

Preprocessing lives inside, so a server or an app feeds pixels as they come.
"""

from __future__ import annotations

import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.model import returns_probabilities


# What the model takes and returns is the model's to say (ViT.takes_raw_pixels,
# ViT.output_activation; keras_vit.images and keras_vit.model read them for any model).
takes_raw_pixels = images_lib.takes_raw_pixels


def input_size(model):
    """(height, width, channels) the artifacts are validated at (and a fixed-size
    artifact takes): the model's input, or for a model that takes any size
    (ViT(dynamic_image_size=True)) the size it was built for."""
    if is_dynamic(model):
        return (*model.image_size, int(model.inputs[0].shape[-1]))
    return tuple(int(d) for d in model.inputs[0].shape[1:])


def is_dynamic(model) -> bool:
    """True for a model whose input takes any height and width."""
    return bool(getattr(model, "dynamic_image_size", False))


def probabilities(model, images):
    """float32 (B, H, W, C) pixels 0..255 -> (B, classes) probabilities: the
    model's own where its head ends in softmax or sigmoid (multi-label: each
    class on its own), else the softmax of its logits."""
    x = tf.cast(images, tf.float32)
    if not takes_raw_pixels(model):
        # plain arithmetic on a tf tensor: no Keras op in the graph
        x = images_lib.normalize(x, images_lib.pixel_normalization(model))
    scores = tf.cast(model(x, training=False), tf.float32)
    return scores if returns_probabilities(model) else tf.nn.softmax(scores, axis=-1)


def keras_probabilities(model, images, batch_size=64):
    """The reference every artifact is compared with, computed in this process."""
    import numpy as np

    fn = tf.function(lambda x: probabilities(model, x), reduce_retracing=True)
    return np.concatenate([fn(tf.constant(images[i:i + batch_size])).numpy()
                           for i in range(0, len(images), batch_size)])
