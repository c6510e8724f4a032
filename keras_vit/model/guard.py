"""The eager input guard of a ViT: images of the wrong channels, rank or grid, and
pixels 0..255 given to a model that takes [-1, 1], are refused in one line before Keras
answers wrongly (a mixin of keras_vit.model.ViT)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_vit.errors import UserError
from keras_vit.model.description import MODEL_RANGE, PIXEL_RANGE, PIXELS_ABOVE


class InputGuard:
    """ViT's checks of concrete inputs in `__call__`, `predict`, `predict_on_batch` and `evaluate`."""

    def _check_input_range(self, inputs):
        """Raises when a [-1, 1] model is given concrete values that are plainly pixels 0..255."""
        if self.takes_raw_pixels or not getattr(self, "check_input_range", True):
            return
        bounds = _value_range(inputs)
        if bounds is None:
            return
        low, high = bounds
        if low >= 0 and high > _pixels_above(self.config.pixel_normalization):
            raise UserError(
                f"{self.name} takes images {self.input_range if self.input_range != MODEL_RANGE else 'in ' + MODEL_RANGE}"
                f", but got values from {low:g} to {high:g}, which look "
                f"like pixels {PIXEL_RANGE}: pass {self._preprocess_call()}, or use "
                f"model.with_preprocessing() for a model that takes {PIXEL_RANGE} (set model.check_input_range = "
                f"False if these values are meant).")

    def predict(self, x, *args, **kwargs):
        self._check_input_range(x)
        return super().predict(x, *args, **kwargs)

    def predict_on_batch(self, x):
        self._check_input_range(x)
        return super().predict_on_batch(x)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_input_range(x)
        return super().evaluate(x, *args, **kwargs)

    def __call__(self, inputs, *args, **kwargs):
        # A clearer error than Keras' generic input-spec mismatch.
        shape = getattr(inputs, "shape", None)
        if shape is not None and len(shape) == 4 and shape[-1] is not None and shape[-1] != self.num_channels:
            raise UserError(
                f"{self.name} expects images with {self.num_channels} channels (NHWC), got shape "
                f"{tuple(shape)}. Convert grayscale/RGBA images to RGB, or build the model with "
                f"num_channels={shape[-1]}."
            )
        if shape is not None and len(shape) != 4:
            raise UserError(
                f"{self.name} expects a batch of NHWC images (4 dimensions), got shape {tuple(shape)}."
            )
        stride = self.config.total_stride
        if (shape is not None and self.dynamic_image_size and not self.dynamic_image_pad
                and any(side is not None and side % stride for side in shape[1:3])):
            raise UserError(f"{self.name} takes heights and widths that are multiples of {stride}, got "
                            f"{tuple(shape[1:3])}: resize the images, or build with dynamic_image_pad=True.")
        self._check_input_range(inputs)
        return super().__call__(inputs, *args, **kwargs)


def _pixels_above(normalization):
    """Above this, non-negative inputs cannot be normalised pixels: 2 for [-1, 1]
    (PIXELS_ABOVE), or just above a family's whitest value ((255 - mean) / std)."""
    if normalization == "minus_one_to_one":
        return PIXELS_ABOVE
    from keras_vit.images import NORMALIZATIONS

    mean, std = NORMALIZATIONS[normalization]
    return max((255.0 - m) / s for m, s in zip(mean, std)) + 0.01


def _value_range(x):
    """(min, max) of concrete inputs (a numpy array or an eager tensor of the
    backend); None for symbolic or traced ones (inside a compiled function),
    datasets, generators and anything else."""
    if isinstance(x, np.ndarray):
        if x.size == 0 or x.dtype.kind not in "biuf":
            return None
        return float(np.min(x)), float(np.max(x))
    if keras.backend.is_keras_tensor(x):
        return None
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if not (isinstance(x, tf.Tensor) and tf.executing_eagerly() and hasattr(x, "numpy")):
            return None
    elif backend == "jax":
        import jax

        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            return None
    elif backend == "torch":
        import torch

        if not isinstance(x, torch.Tensor):
            return None
    else:
        return None
    try:
        if int(np.prod(tuple(x.shape))) == 0:
            return None
        return float(ops.min(x)), float(ops.max(x))
    except (TypeError, ValueError):  # a dtype without an order (bool, string): the model's own error follows
        return None
