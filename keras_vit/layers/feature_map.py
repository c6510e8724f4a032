"""Patch tokens back on their grid: the dense features of detection and segmentation heads."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class TokensToMap(keras.layers.Layer):
    """(tokens (B, P + R*C, D), images (B, H, W, C)) -> (B, R, C, D): the patch
    tokens after the `num_prefix_tokens` prefix, row-major as the patch
    embedding flattened them, on the grid of the images (H / stride, W /
    stride; rounded up with `pad`, as a dynamic_image_pad model pads). The
    grid is read from the images when the layer runs, so one feature model
    serves every size of a dynamic model."""

    def __init__(self, num_prefix_tokens, stride, pad=False, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = int(stride)
        self.pad = bool(pad)

    def _side(self, size):
        return (size + self.stride - 1) // self.stride if self.pad else size // self.stride

    def call(self, tokens, images):
        shape = ops.shape(images)
        rows, cols = self._side(shape[1]), self._side(shape[2])
        return ops.reshape(tokens[:, self.num_prefix_tokens:], (-1, rows, cols, tokens.shape[-1]))

    def compute_output_shape(self, tokens_shape, images_shape):
        rows = None if images_shape[1] is None else self._side(images_shape[1])
        cols = None if images_shape[2] is None else self._side(images_shape[2])
        return (tokens_shape[0], rows, cols, tokens_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens, "stride": self.stride,
                "pad": self.pad}
