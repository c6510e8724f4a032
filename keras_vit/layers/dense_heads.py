"""Heads from a ViT's patch-token grids to one output per pixel (segmentation logits, log-depth).

Both take the grids of chosen encoder blocks, each (B, rows, cols, D), and return
(B, rows * stride, cols * stride, outputs): the image's own pixels.

- `LinearHead`: one linear map of the last grid's tokens, upsampled bilinearly to the pixels:
  the linear probe DINOv2 and DINOv3 report segmentation and depth with (their BatchNorm left
  out: the tokens come through the encoder's final norm already).
- `DPTHead`: DPT's decoder (Ranftl et al. 2021) on four blocks: each grid reassembled at 4x,
  2x, 1x and 1/2x its size, fused from the coarsest up through residual convolution units,
  then convolved up to the pixels.

A head reads its sizes from the grids it is given, so one built for one grid answers on any
other (a PatchGridModel of any image size: DINOv3's, exported for any size).
"""

from __future__ import annotations

import keras
from keras import ops

# DPT's resampling of its four grids (its "reassemble" factors), finest first.
DPT_SCALES = (4, 2, 1, 0.5)


def _resize(x, size):
    if all(isinstance(side, int) for side in size):
        return ops.image.resize(x, size, interpolation="bilinear")
    # Sizes known only when the graph runs (a model for any image size): the TF backend alone
    # traces such a graph (JAX and PyTorch see concrete shapes), and keras.ops.image.resize
    # refuses a symbolic size; tf.image.resize is the op it calls with a known one.
    import tensorflow as tf

    return tf.image.resize(x, tf.stack(size), method="bilinear")


def _grid_size(x):
    """(rows, cols) of a (B, rows, cols, C) map: ints where known, tensors where not."""
    shape = ops.shape(x)
    return shape[1], shape[2]


@keras.saving.register_keras_serializable(package="keras_vit")
class LinearHead(keras.layers.Layer):
    """grids (a list, the last one read; or one grid) -> (B, H, W, outputs)."""

    def __init__(self, outputs: int, stride: int, **kwargs):
        super().__init__(**kwargs)
        self.outputs, self.stride = int(outputs), int(stride)
        self.classifier = keras.layers.Dense(self.outputs, name="classifier", dtype=self.dtype_policy)

    def build(self, input_shape):
        shape = input_shape[-1] if isinstance(input_shape, (list, tuple)) and isinstance(input_shape[0], (list, tuple)) \
            else input_shape
        self.classifier.build(shape)

    def call(self, grids, training=False):
        grid = grids[-1] if isinstance(grids, (list, tuple)) else grids
        rows, cols = _grid_size(grid)
        return _resize(self.classifier(grid), (rows * self.stride, cols * self.stride))

    def get_config(self):
        return {**super().get_config(), "outputs": self.outputs, "stride": self.stride}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResidualConvUnit(keras.layers.Layer):
    """x + conv(relu(conv(relu(x)))): DPT's refinement at one scale."""

    def __init__(self, features: int, **kwargs):
        super().__init__(**kwargs)
        self.features = int(features)
        self.first = keras.layers.Conv2D(self.features, 3, padding="same", name="conv1", dtype=self.dtype_policy)
        self.second = keras.layers.Conv2D(self.features, 3, padding="same", name="conv2", dtype=self.dtype_policy)

    def build(self, input_shape):
        self.first.build(input_shape)
        self.second.build((*input_shape[:-1], self.features))

    def call(self, x):
        return x + self.second(ops.relu(self.first(ops.relu(x))))

    def get_config(self):
        return {**super().get_config(), "features": self.features}


@keras.saving.register_keras_serializable(package="keras_vit")
class DPTHead(keras.layers.Layer):
    """Four grids (B, rows, cols, D), shallow to deep -> (B, H, W, outputs).

    Args:
        outputs: channels per pixel (classes; 1 for depth).
        stride: pixels per patch (the ViT's total stride).
        features: the decoder's width (DPT-Base: 256).
    """

    def __init__(self, outputs: int, stride: int, features: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.outputs, self.stride, self.features = int(outputs), int(stride), int(features)
        policy, f = self.dtype_policy, self.features
        self.project = [keras.layers.Dense(f, name=f"project_{i}", dtype=policy) for i in range(4)]
        self.resample = [
            keras.layers.Conv2DTranspose(f, 4, strides=4, name="resample_0", dtype=policy),
            keras.layers.Conv2DTranspose(f, 2, strides=2, name="resample_1", dtype=policy),
            None,
            keras.layers.Conv2D(f, 3, strides=2, padding="same", name="resample_3", dtype=policy),
        ]
        self.skip_units = [ResidualConvUnit(f, name=f"fusion_{i}_skip", dtype=policy) for i in range(4)]
        self.units = [ResidualConvUnit(f, name=f"fusion_{i}_unit", dtype=policy) for i in range(4)]
        self.fusion_out = [keras.layers.Dense(f, name=f"fusion_{i}_out", dtype=policy) for i in range(4)]
        self.head_conv = keras.layers.Conv2D(max(f // 2, 1), 3, padding="same", name="head_conv", dtype=policy)
        self.head_hidden = keras.layers.Conv2D(32, 3, padding="same", name="head_hidden", dtype=policy)
        self.head_out = keras.layers.Conv2D(self.outputs, 1, name="head_out", dtype=policy)

    def build(self, input_shape):
        # The sublayers are built for the grid given here; call reads each size from its input.
        rows, cols, width = int(input_shape[0][1]), int(input_shape[0][2]), int(input_shape[0][3])
        half = (-(-rows // 2), -(-cols // 2))
        sizes = [(rows * 4, cols * 4), (rows * 2, cols * 2), (rows, cols), half]  # the reassembled grids
        f = self.features
        for i in range(4):
            self.project[i].build((None, rows, cols, width))
            if self.resample[i] is not None:
                self.resample[i].build((None, rows, cols, f))
            self.skip_units[i].build((None, *sizes[i], f))
            self.units[i].build((None, *sizes[i], f))
            self.fusion_out[i].build((None, None, None, f))
        finest = (rows * 8, cols * 8)
        self.head_conv.build((None, *finest, f))
        self.head_hidden.build((None, rows * self.stride, cols * self.stride, max(f // 2, 1)))
        self.head_out.build((None, rows * self.stride, cols * self.stride, 32))

    def call(self, grids, training=False):
        grids = list(grids)
        reassembled = []
        for i, grid in enumerate(grids):
            x = self.project[i](grid)
            reassembled.append(x if self.resample[i] is None else self.resample[i](x))
        # From the coarsest up: each fused map refined, resized to the next finer grid, added to it.
        x = None
        for i in (3, 2, 1, 0):
            skip = self.skip_units[i](reassembled[i])
            x = skip if x is None else skip + x
            x = self.units[i](x)
            if i:
                target = _grid_size(reassembled[i - 1])
            else:
                finest = _grid_size(reassembled[0])
                target = (finest[0] * 2, finest[1] * 2)
            x = self.fusion_out[i](_resize(x, target))
        x = self.head_conv(x)
        rows, cols = _grid_size(grids[0])
        x = _resize(x, (rows * self.stride, cols * self.stride))
        return self.head_out(ops.relu(self.head_hidden(x)))

    def get_config(self):
        return {**super().get_config(), "outputs": self.outputs, "stride": self.stride, "features": self.features}


def dpt_blocks(num_layers: int) -> tuple:
    """The four blocks DPT reads, evenly through the encoder: (2, 5, 8, 11) of 12, (5, 11, 17, 23) of 24."""
    return tuple(max(0, round((k + 1) * num_layers / 4) - 1) for k in range(4))
