"""The grid side of models that take any image size (ViT(dynamic_image_size=True)):
the patch grid of the images that arrive, padding to a multiple of the patch,
and the choice between the trained table and one resized to the grid at run
time. The resize itself is the load-time one (keras_vit.layers.interpolation,
in Keras ops), so a dynamic model at size S equals a model built at S from the
same weights (tests/test_dynamic_size.py holds the two together).
"""

import keras
from keras import ops


def grid_of(images, stride):
    """(rows, cols) of the patch grid of NHWC `images`: Python ints when the
    shape is static, scalar tensors when it is known only at run time."""
    height, width = images.shape[1], images.shape[2]
    if height is not None and width is not None:
        return int(height) // stride, int(width) // stride
    shape = ops.shape(images)
    return shape[1] // stride, shape[2] // stride


def table_for_grid(trained_grid, grid, trained_table, resized_table):
    """`trained_table()` when `grid` is the trained one, else `resized_table()`.

    Static grids decide in Python (nothing is added to the graph at the
    trained size); run-time grids through a conditional, so the trained size
    still skips the interpolation when the model runs."""
    rows, cols = grid
    if isinstance(rows, int) and isinstance(cols, int):
        return trained_table() if (rows, cols) == tuple(trained_grid) else resized_table()
    same = ops.logical_and(ops.equal(rows, trained_grid[0]), ops.equal(cols, trained_grid[1]))
    return ops.cond(same, trained_table, resized_table)


@keras.saving.register_keras_serializable(package="keras_vit")
class PadToMultiple(keras.layers.Layer):
    """Pads NHWC images at the bottom and right with `value` up to the next
    multiple of `multiple` in height and width (ViT(dynamic_image_pad=True);
    timm's dynamic_img_pad pads the same sides with zeros). Placed after the
    scaling to [-1, 1], so the default 0 is mid-grey."""

    def __init__(self, multiple, value=0.0, **kwargs):
        super().__init__(**kwargs)
        self.multiple = int(multiple)
        self.value = float(value)

    def call(self, images):
        shape = ops.shape(images)
        pad_h = (-shape[1]) % self.multiple
        pad_w = (-shape[2]) % self.multiple
        return ops.pad(images, [[0, 0], [0, pad_h], [0, pad_w], [0, 0]], constant_values=self.value)

    def compute_output_shape(self, input_shape):
        def padded(size):
            return None if size is None else -(-size // self.multiple) * self.multiple
        return (input_shape[0], padded(input_shape[1]), padded(input_shape[2]), input_shape[3])

    def get_config(self):
        return {**super().get_config(), "multiple": self.multiple, "value": self.value}


def add_positions(layer, tokens, images=None):
    """`tokens` plus the position table of `layer` (an absolute position
    embedding with `grid_size`, `stride`, `table()` and `table_at(rows,
    cols)`): its trained table, or with `images` (what the model was given,
    padded) the table of their grid, interpolated in the graph."""
    if images is None:
        table = layer.table()
    else:
        if layer.stride is None:
            raise ValueError(f"{layer.name} was built for a fixed grid: build the model with dynamic_image_size=True "
                             f"to call it on images of any size.")
        grid = grid_of(images, layer.stride)
        table = table_for_grid(layer.grid_size, grid, layer.table, lambda: layer.table_at(*grid))
        # A conditional's two shapes meet at an unknown rank; restoring it keeps the attention's
        # einsums plain matmuls for the converters (TFLite lowers none of unknown rank).
        table = ops.reshape(table, (1, -1, tokens.shape[-1]))
    return tokens + ops.cast(table, tokens.dtype)
