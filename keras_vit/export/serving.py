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


def traced_probabilities(model):
    """`probabilities` of `model` traced once into one graph: float32 pixels of any batch size
    (and any height and width for a dynamic model). It is the Keras model's own graph, as
    `model(x, training=False)` runs it; an export traces it once and computes its reference,
    calibration reference and Keras latency with it (a tf.function per call, or per batch
    shape, traced the model again each time)."""
    height, width, channels = input_size(model)
    if is_dynamic(model):
        height = width = None
    spec = tf.TensorSpec((None, height, width, channels), tf.float32)
    return tf.function(lambda x: probabilities(model, x), input_signature=[spec]).get_concrete_function()


def keras_probabilities(model, images, batch_size=64, traced=None):
    """The reference every artifact is compared with, computed in this process
    (`traced`: traced_probabilities(model), when the caller has it already)."""
    import numpy as np

    fn = traced_probabilities(model) if traced is None else traced
    images = np.asarray(images, np.float32)
    return np.concatenate([fn(tf.constant(images[i:i + batch_size])).numpy()
                           for i in range(0, len(images), batch_size)])
