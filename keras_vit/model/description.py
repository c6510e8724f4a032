"""What a ViT is and takes, in words and in figures: its input range, its output
activation and its description (a mixin of keras_vit.model.ViT)."""

from __future__ import annotations

import keras

from keras_vit.config import ViTConfig
from keras_vit.variants import canonical_name

# What a model takes, by whether it scales pixels itself (ViT.input_range).
MODEL_RANGE = "[-1, 1]"

PIXEL_RANGE = "0..255"

# Inputs of a [-1, 1] model that are all >= 0 with a maximum above this are pixels (ViT.check_input_range).
PIXELS_ABOVE = 2.0

# Final activations whose outputs are probabilities already (ViT.output_activation): nothing goes on top.
PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


class Description:
    """ViT's descriptions: what it takes and returns, `describe()` and `summary()`."""

    @property
    def output_activation(self):
        """"softmax" or "sigmoid" when the head ends in one (its outputs are
        probabilities already: single-label or multi-label), None when it
        returns logits or there is no head. Read from the head layer itself,
        so it holds however the model was built or loaded."""
        return None if self.head is None else activation_name(getattr(self.head, "activation", None))

    @property
    def returns_probabilities(self) -> bool:
        """True when the outputs are probabilities already (`output_activation`
        is softmax or sigmoid); False for logits, which take a softmax."""
        return self.output_activation is not None

    # --- what the model takes -------------------------------------------------------------------------

    @property
    def takes_raw_pixels(self) -> bool:
        """True when the model takes pixels 0..255 and scales them itself
        (include_preprocessing=True); False when it takes [-1, 1]."""
        return self.include_preprocessing

    @property
    def input_range(self) -> str:
        """"0..255" (pixels, scaled inside), "[-1, 1]" (keras_vit.preprocess_input(pixels)),
        or a family's normalisation ("imagenet-normalised": preprocess_input(pixels, "imagenet"))."""
        if self.takes_raw_pixels:
            return PIXEL_RANGE
        normalization = self.config.pixel_normalization
        return MODEL_RANGE if normalization == "minus_one_to_one" else f"{normalization}-normalised"

    def _preprocess_call(self) -> str:
        normalization = self.config.pixel_normalization
        extra = "" if normalization == "minus_one_to_one" else f", {normalization!r}"
        return f"keras_vit.preprocess_input(pixels{extra})"

    @property
    def input_description(self) -> str:
        """One line: the input shape and range, and how to get there from pixels."""
        shape = f"(B, {self.image_size[0]}, {self.image_size[1]}, {self.num_channels})"
        if self.dynamic_image_size:
            sizes = "any size" if self.dynamic_image_pad else f"multiples of {self.config.total_stride}"
            trained = "x".join(str(side) for side in self.image_size)
            shape = f"(B, H, W, {self.num_channels}), H and W {sizes} (trained at {trained})"
        normalization = self.config.pixel_normalization
        inside = MODEL_RANGE if normalization == "minus_one_to_one" else f"{normalization} mean/std"
        if self.takes_raw_pixels:
            return f"images {shape} of pixels {PIXEL_RANGE} (scaled to {inside} inside)"
        return (f"images {shape} {'in' if normalization == 'minus_one_to_one' else 'normalised with'} {inside} "
                f"({self._preprocess_call().replace('pixels', 'pixels ' + PIXEL_RANGE)})")

    def describe(self) -> str:
        """A few lines saying what the model is and what it takes and returns."""
        config = self.config
        grid = self.grid_size
        hybrid = f", ResNet-{config.resnet.num_layers} stem" if config.resnet else ""
        prefix = self.num_prefix_tokens
        tokens = f", {prefix} prefix token{'s' * (prefix != 1)}" if prefix != 1 else ""
        lines = [
            f"{self.name}: {_family_name(config)}, {config.num_layers} blocks of width {config.hidden_size}, {config.num_heads} heads"
            f"{hybrid}{tokens}; {config.total_stride}x{config.total_stride}-pixel patches, {grid[0]}x{grid[1]} grid; "
            f"{self.count_params():,} parameters",
            f"inputs: {self.input_description}",
        ]
        if self.include_top:
            activation = self.classifier_activation
            kind = "logits" if activation is None else (
                activation if isinstance(activation, str) else getattr(activation, "__name__", "activations"))
            labels = self.labels
            named = "" if labels is None else ": " + ", ".join(labels[:5]) + (", ..." if len(labels) > 5 else "")
            lines.append(f"outputs: (B, {self.num_classes}) {kind}{named}")
        else:
            lines.append(f"outputs: (B, {self.output_shape[-1]}) features (no classification head)")
        return "\n".join(lines)

    def summary(self, *args, **kwargs):
        """Keras' summary, then the line saying what the model takes (`input_description`)."""
        super().summary(*args, **kwargs)
        print_fn = kwargs.get("print_fn") or (args[2] if len(args) > 2 else None) or print
        print_fn(f" Inputs: {self.input_description}")


def activation_name(activation):
    """"softmax" or "sigmoid" when `activation` (a name, a Keras or TF
    function, a serialized dict, an activation layer) is one; else None."""
    if activation is None:
        return None
    if isinstance(activation, keras.layers.Softmax):
        return "softmax"
    if isinstance(activation, keras.layers.Activation):
        return activation_name(activation.activation)
    if isinstance(activation, dict):
        activation = keras.activations.deserialize(activation)
    if isinstance(activation, str):
        try:
            activation = keras.activations.get(activation)
        except ValueError:  # not a Keras name (e.g. a custom one): not a probability activation we know
            return None
    name = getattr(activation, "__name__", "")
    name = name[:-3] if name.endswith("_v2") else name  # tf.nn.softmax is softmax_v2
    return name if name in PROBABILITY_ACTIVATIONS else None


def _family_name(config: ViTConfig) -> str:
    """"ViT", or the descendant its variant names ("DINOv2-reg", "CLIP", ...)."""
    try:
        name = canonical_name(config)
    except ValueError:
        return "ViT"
    return name.rsplit("-", 1)[0] if "-" in name else "ViT"
