"""The hybrid model's BiT-style ResNet stem (ResNet-v1.5 bottlenecks with
weight-standardised convs and GroupNorm), producing the feature map that is
cut into 1x1 "patches"."""

import keras
from keras import ops

from keras_vit.layers.std_conv import StdConv2D, pad_same

GROUP_NORM_GROUPS = 32
GROUP_NORM_EPSILON = 1e-6  # Flax's GroupNorm default, as the official code uses.


def _group_norm(name, policy, gamma_initializer="ones"):
    return keras.layers.GroupNormalization(
        groups=GROUP_NORM_GROUPS, epsilon=GROUP_NORM_EPSILON, gamma_initializer=gamma_initializer,
        name=name, dtype=policy,
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """1x1 (features) -> 3x3 (features, stride here) -> 1x1 (4 * features),
    each followed by GroupNorm, ReLU after the first two and after the sum.

    A projection (1x1 StdConv + GroupNorm) carries the residual when the
    width or the stride changes. The last GroupNorm starts at scale 0 so each
    unit starts as the identity.
    """

    def __init__(self, features, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        policy = self.dtype_policy
        self.conv1 = StdConv2D(self.features, 1, name="conv1", dtype=policy)
        self.gn1 = _group_norm("gn1", policy)
        self.conv2 = StdConv2D(self.features, 3, self.strides, name="conv2", dtype=policy)
        self.gn2 = _group_norm("gn2", policy)
        self.conv3 = StdConv2D(4 * self.features, 1, name="conv3", dtype=policy)
        self.gn3 = _group_norm("gn3", policy, gamma_initializer="zeros")

    def build(self, input_shape):
        self.needs_projection = input_shape[-1] != 4 * self.features or self.strides != 1
        if self.needs_projection:
            self.conv_proj = StdConv2D(4 * self.features, 1, self.strides, name="conv_proj", dtype=self.dtype_policy)
            self.gn_proj = _group_norm("gn_proj", self.dtype_policy)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        shape = input_shape
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)

    def call(self, x):
        residual = self.gn_proj(self.conv_proj(x)) if self.needs_projection else x
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        def out(n):
            return None if n is None else -(-n // self.strides)

        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), 4 * self.features)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "strides": self.strides}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """Root (7x7/2 StdConv, GroupNorm, ReLU, 3x3/2 max-pool) then stages.

    Stage s (named block{s+1}) has num_layers[s] bottleneck units of width
    width * 2**s; every stage but the first starts with stride 2.

    Args:
        num_layers: units per stage, e.g. (3, 4, 9).
        width_factor: multiplies the base width of 64.
    """

    def __init__(self, num_layers=(3, 4, 9), width_factor=1, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = tuple(int(n) for n in num_layers)
        self.width_factor = int(width_factor)
        width = 64 * self.width_factor
        policy = self.dtype_policy
        self.conv_root = StdConv2D(width, 7, 2, name="conv_root", dtype=policy)
        self.gn_root = _group_norm("gn_root", policy)
        # One flat list (Keras tracks it); checkpoint_keys[i] is units[i]'s
        # place in the official checkpoint, "block{stage}/unit{unit}".
        self.units, self.checkpoint_keys = [], []
        for s, units in enumerate(self.num_layers):
            for u in range(units):
                stride = 2 if s > 0 and u == 0 else 1
                self.units.append(
                    BottleneckUnit(width * 2**s, stride, name=f"block{s + 1}_unit{u + 1}", dtype=policy))
                self.checkpoint_keys.append(f"block{s + 1}/unit{u + 1}")

    def build(self, input_shape):
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = (shape[0], _pooled(shape[1]), _pooled(shape[2]), shape[3])
        for unit in self.units:
            unit.build(shape)
            shape = unit.compute_output_shape(shape)

    def call(self, x):
        x = ops.relu(self.gn_root(self.conv_root(x)))
        x = pad_same(x, 3, 2, value=float("-inf"))
        x = ops.max_pool(x, pool_size=3, strides=2, padding="valid")
        for unit in self.units:
            x = unit(x)
        return x

    def compute_output_shape(self, input_shape):
        shape = self.conv_root.compute_output_shape(input_shape)
        shape = (shape[0], _pooled(shape[1]), _pooled(shape[2]), shape[3])
        for unit in self.units:
            shape = unit.compute_output_shape(shape)
        return shape

    def get_config(self):
        return {**super().get_config(), "num_layers": list(self.num_layers), "width_factor": self.width_factor}


def _pooled(n):
    return None if n is None else -(-n // 2)
