"""Weight-standardised convolution with TensorFlow-style 'SAME' padding (BiT)."""

import keras
from keras import ops


def same_padding(size, kernel_size, stride):
    """(before, after) padding of TF/XLA 'SAME': the odd pixel goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


def pad_same(x, kernel_size, stride, value=0.0):
    """Pads NHWC `x` so that a 'valid' window op behaves like TF's 'SAME'.

    Explicit padding keeps every Keras backend identical to the official
    (XLA) behaviour, which puts the extra row/column at the bottom/right.
    """
    height, width = x.shape[1], x.shape[2]
    # A dynamic model (size known at run time) takes multiples of the whole stem's stride, so every
    # window op here sees a multiple of its own stride, whose 'SAME' padding does not depend on the size.
    pad_h = same_padding(stride if height is None else height, kernel_size, stride)
    pad_w = same_padding(stride if width is None else width, kernel_size, stride)
    if pad_h == (0, 0) and pad_w == (0, 0):
        return x
    return ops.pad(x, ((0, 0), pad_h, pad_w, (0, 0)), constant_values=value)


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Layer):
    """Conv2D whose kernel is standardised per output channel before use:
    w <- (w - mean(w)) / (std(w) + 1e-5), statistics over (kh, kw, c_in).

    No bias (every StdConv in the hybrid is followed by GroupNorm). The stored
    kernel is the raw one, as in the official checkpoints.
    """

    def __init__(self, filters, kernel_size, strides=1, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.kernel_size = int(kernel_size)
        self.strides = int(strides)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.kernel_size, self.kernel_size, input_shape[-1], self.filters),
            initializer=keras.initializers.LecunNormal(),
        )

    def call(self, x):
        w = self.kernel
        mean = ops.mean(w, axis=(0, 1, 2), keepdims=True)
        std = ops.std(w, axis=(0, 1, 2), keepdims=True)
        w = (w - mean) / (std + self.epsilon)
        x = pad_same(x, self.kernel_size, self.strides)
        return ops.conv(x, ops.cast(w, x.dtype), strides=self.strides, padding="valid")

    def compute_output_shape(self, input_shape):
        def out(n):
            return None if n is None else -(-n // self.strides)

        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), self.filters)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "epsilon": self.epsilon,
        }
