"""The Vision Transformer model: layers assembled into a Keras functional model."""

from __future__ import annotations

import types

import keras
import numpy as np
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.config import ViTConfig
from keras_vit.labels import check_labels
from keras_vit.variants import canonical_name, get_variant
from keras_vit.errors import UserError
from keras_vit.weights import parts as weight_parts


# What a model takes, by whether it scales pixels itself (ViT.input_range).
MODEL_RANGE = "[-1, 1]"
PIXEL_RANGE = "0..255"
# Inputs of a [-1, 1] model that are all >= 0 with a maximum above this are pixels (ViT.check_input_range).
PIXELS_ABOVE = 2.0
# Final activations whose outputs are probabilities already (ViT.output_activation): nothing goes on top.
PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


def preprocess_input(images, normalization="minus_one_to_one"):
    """Scales 0..255 pixels to what a ViT takes unless it was built with
    include_preprocessing=True (`model.input_range` says which): [-1, 1] (the
    official checkpoints', SigLIP's and every model keras_vit trains from
    scratch), or for a DeiT, DINOv2 or CLIP checkpoint its family's
    normalisation: pass `model.config.pixel_normalization` ("imagenet", "clip")."""
    from keras_vit.images import normalize

    return normalize(ops.cast(images, "float32"), normalization)


def _image_size(image_size):
    if isinstance(image_size, int):
        return (image_size, image_size)
    size = tuple(int(s) for s in image_size)
    if len(size) != 2:
        raise UserError(f"image_size must be an int or (height, width), got {image_size!r}.")
    return size


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(keras.Model):
    """A Vision Transformer (Dosovitskiy et al., 2021), a hybrid ResNet+ViT, or
    one of its descendants (DeiT, DINOv2, SigLIP and CLIP image towers: the
    switches of ViTConfig, the names of keras_vit.VARIANTS).

    The backbone (`model.backbone`: images -> tokens): images (B, H, W, C) in
    [-1, 1] (a family's normalisation, or 0..255 with include_preprocessing)
    -> [ResNet stem] -> patches -> [class token] -> [distillation token] ->
    + position embedding -> [registers] -> [pre-norm] -> encoder (final norm
    on every token, unless the family norms the pooled vector). The heads
    read its tokens: pooling (class token, mean, MAP, class token + mean) ->
    [pooled norm] -> [projection] -> [pre-logits] -> [head], or DeiT's two
    heads on the class and distillation tokens. With
    position_embedding="relative" (or "none") nothing is added to the
    tokens: the encoder's attention carries the relative bias instead.

    Inputs: the model records what it takes (`input_range`: "[-1, 1]", or
    "0..255" with include_preprocessing; `summary()` and `describe()` say
    it). A [-1, 1] model takes `keras_vit.preprocess_input(pixels)`; called
    eagerly (`model(x)`, `predict`, `predict_on_batch`, `evaluate`) on
    values that are plainly pixels (all >= 0, maximum above 2) it raises a
    one-line ValueError instead of answering wrongly (`check_input_range =
    False` turns this off). `with_preprocessing()` returns the same model
    taking 0..255, as every exported artifact does.

    Args:
        config: a ViTConfig or a variant name ("B/16", "R50+B/16", ...).
        image_size: int or (height, width); must be a multiple of the
            patch size (times the ResNet stride for a hybrid).
        num_classes: outputs of the classification head.
        include_top: False returns the pooled image embedding (B, D): the
            head's input (after any pooled norm, projection or representation
            layer; transformers' pooler_output, CLIP's image_embeds).
        weights: None (random init), a path to an official-format `.npz`,
            or a checkpoint name such as "imagenet21k" (downloaded once and
            cached). The position embedding is resized to this image size.
        include_preprocessing: take 0..255 pixels and scale them inside.
        classifier_activation: activation of the head (None: logits).
        num_channels: input channels (3 for every official checkpoint).
        labels: class names of the head (index = class id), or None. Part
            of the config, so `.keras` files keep them and predict and
            export show them; `from_pretrained` fills them in from the
            checkpoint.
        dynamic_image_size: take images of any height and width that are
            multiples of the patch size (input (B, None, None, C)); the
            position embedding, trained for `image_size`, is interpolated
            in the graph for other grids, with the load-time resize's
            method, and not at all at `image_size`.
        dynamic_image_pad: with dynamic_image_size, take any size: images
            are padded at the bottom and right (with 0, mid-grey in
            [-1, 1]) up to the next multiple of the patch size.

    Keyword Args:
        **kwargs: ViTConfig fields to change, e.g. representation_size=768
            or dropout_rate=0.1 (and Keras' own `trainable`, `dtype`).
    """

    def __init__(
        self,
        config="B/16",
        image_size=224,
        num_classes=1000,
        include_top=True,
        weights=None,
        include_preprocessing=False,
        classifier_activation=None,
        num_channels=3,
        name=None,
        labels=None,
        dynamic_image_size=False,
        dynamic_image_pad=False,
        **kwargs,
    ):
        # Anything that is not a Keras Model argument is a ViTConfig override.
        model_kwargs = {k: kwargs.pop(k) for k in ("trainable", "dtype") if k in kwargs}
        if isinstance(config, dict):
            config = ViTConfig.from_dict(config)
        config = get_variant(config)
        if kwargs:
            config = config.replace(**kwargs)
        height, width = _image_size(image_size)
        stride = config.total_stride
        if height % stride or width % stride:
            raise UserError(
                f"image_size {(height, width)} is not divisible by the patch size {stride}"
                f"{' (patch size x ResNet stride)' if config.resnet else ''}: use a multiple of "
                f"{stride}, e.g. {max(1, round(height / stride)) * stride}."
            )
        if dynamic_image_pad and not dynamic_image_size:
            raise UserError("dynamic_image_pad=True pads images of any size for a dynamic model: also pass "
                            "dynamic_image_size=True.")
        if dynamic_image_size and config.position_embedding == "relative":
            raise UserError("dynamic_image_size=True cannot resize the relative position bias in the graph yet: "
                            "build the model at a fixed image_size (its weights are resized at load).")
        if int(num_channels) < 1:
            raise UserError(f"num_channels must be positive, got {num_channels}.")
        if include_top and (num_classes is None or int(num_classes) < 1):
            raise UserError(f"num_classes must be a positive integer when include_top=True, got {num_classes!r}.")

        # === Layers ===
        parts = _build_layers(config, (height // stride, width // stride), include_top, num_classes,
                              classifier_activation, include_preprocessing, dynamic_image_size, dynamic_image_pad)

        # === Functional model ===
        input_size = (None, None) if dynamic_image_size else (height, width)
        images = keras.Input((*input_size, int(num_channels)), name="images")
        tokens = parts.encoder(embed_images(images, parts))
        outputs = read_out(tokens, parts)
        super().__init__(inputs=images, outputs=outputs, name=name or _default_name(config), **model_kwargs)

        # === Config ===
        self.config = config
        self.image_size = (height, width)
        self.num_classes = int(num_classes) if include_top else None
        self.include_top = bool(include_top)
        self.include_preprocessing = bool(include_preprocessing)
        self.classifier_activation = classifier_activation
        self.num_channels = int(num_channels)
        self.dynamic_image_size = bool(dynamic_image_size)
        self.dynamic_image_pad = bool(dynamic_image_pad)
        self.labels = labels
        # Not part of the config: a guard for eager calls (see the class docstring).
        self.check_input_range = True
        # Named handles for porting, inspection and export (never list positions); None where absent.
        # position_embedding: the layer adding positions to the tokens (None for "relative" and "none").
        for part, layer in vars(parts).items():
            setattr(self, part, layer)

        if weights is not None:
            from keras_vit.weights import load_weights

            load_weights(self, weights)

    def embed(self, images, training=False, patch_hook=None):
        """Images -> the token sequence the encoder sees (B, T, D), through
        the model's own layers (see `embed_images`, which also built the
        model's graph). `patch_hook(tokens) -> tokens` may change the patch
        tokens (B, N, D) before the class token and position embedding
        (masked patch prediction corrupts them there)."""
        return embed_images(images, self, training=training, patch_hook=patch_hook)

    def forward_stages(self, images, training=False, attention=True):
        """One pass through the model's own layers, keeping what every stage made.

        The same layers and weights as `model(images)` (with attention=True
        the attention of each block is computed explicitly, so the result
        can differ from the fused kernel by float rounding, ~1e-6).

        Args:
            images: what `model(...)` takes (B, H, W, C).
            training: dropout and stochastic depth on or off.
            attention: also return every block's attention probabilities.

        Returns a dict:
            "embeddings": (B, T, D) the tokens entering the encoder;
            "blocks": [(B, T, D)] the output of each encoder block (before the
                final LayerNorm);
            "attention": [(B, heads, T, T)] each block's probabilities
                (only with attention=True);
            "tokens": (B, T, D) the encoder's output (after its LayerNorm,
                where the model normalises tokens);
            "pooled": (B, D) the read-out (class token, mean, MAP head; after
                the pooled norm of a family that has one);
            "pre_logits": the head's input, the pooled image embedding
                (`pooled_embedding`: after any projection and representation
                layer; = "pooled" without them);
            "logits": (B, num_classes) the model's output, the head's
                classifier_activation applied if it has one (only with a head).
        """
        out = {"embeddings": self.embed(images, training=training)}
        encoded = self.encoder(out["embeddings"], training=training, return_attention_scores=attention,
                               return_block_outputs=True)
        if attention:
            out["tokens"], out["attention"], out["blocks"] = encoded
        else:
            out["tokens"], out["blocks"] = encoded
        out["pooled"] = read_pooled(out["tokens"], self)
        out["pre_logits"] = embedding_of_pooled(out["pooled"], self)
        if self.head is not None:
            out["logits"] = read_out(out["tokens"], self)
        return out

    def forward_intermediates(self, images, indices=None, output_format="NHWC", norm=False, prefix_tokens=False,
                              training=False):
        """The outputs of chosen encoder blocks as dense features (timm's
        `forward_intermediates(..., intermediates_only=True)`), for detection
        and segmentation heads; `keras_vit.feature_model` builds the same as a
        Keras model that exports.

        Args:
            images: what `model(...)` takes (B, H, W, C).
            indices: None for every block, an int n for the last n, or a list
                of block indices (negative counts from the end).
            output_format: "NHWC" (B, rows, cols, D) feature maps of the
                patch tokens, or "NLC" (B, N, D) token sequences.
            norm: apply the model's final LayerNorm to each (where the model
                normalises its tokens).
            prefix_tokens: also return each block's prefix tokens (B, P, D)
                (class, distillation, register tokens): a list of (features,
                prefix) pairs.

        Returns a list, one entry per chosen block, in block order.
        """
        chosen = block_indices(self.config.num_layers, indices)
        x = self.embed(images, training=training)
        out = []
        for i, block in enumerate(self.encoder.blocks[:max(chosen) + 1]):
            x = block(x, training=training)
            if i in chosen:
                out.append(self.dense_features(x, images, output_format, norm, prefix_tokens))
        return out

    def dense_features(self, tokens, images, output_format="NHWC", norm=False, prefix_tokens=False):
        """One block's tokens (B, T, D) -> its patch features, as `forward_intermediates` returns them."""
        if output_format not in ("NHWC", "NLC"):
            raise UserError(f"output_format must be 'NHWC' or 'NLC', got {output_format!r}.")
        if norm and self.encoder.encoder_norm is not None:
            tokens = self.encoder.encoder_norm(tokens)
        prefix = self.num_prefix_tokens
        if output_format == "NHWC":
            features = self.feature_map_layer()(tokens, images)
        else:
            features = tokens[:, prefix:]
        return (features, tokens[:, :prefix]) if prefix_tokens else features

    def feature_map_layer(self, name=None):
        """The layer putting this model's patch tokens back on their grid (TokensToMap)."""
        return vit_layers.TokensToMap(self.num_prefix_tokens, self.config.total_stride, pad=self.dynamic_image_pad,
                                      name=name)

    @property
    def backbone(self):
        """The model up to its encoded tokens: a keras.Model images -> (B, T, D)
        (embedding, prefix tokens, encoder, final norm) sharing this model's
        layers and weights; heads (pooling, projection, classifier) read its output."""
        return keras.Model(self.inputs[0], self.encoder.output, name=f"{self.name}_backbone")

    @property
    def labels(self):
        """The head's class names (index = class id), or None when unknown."""
        return None if self._labels is None else list(self._labels)

    @labels.setter
    def labels(self, names):
        # Checked here, the one way in (constructor, from_config, from_pretrained,
        # a run folder's labels.txt): a saved model never carries names that do
        # not fit its head.
        if names is not None and not self.include_top:
            raise UserError(f"{self.name} has no classification head (include_top=False): it has no labels.")
        self._labels = None if names is None else tuple(check_labels(names, self.num_classes))

    # --- what the model is: each rule's one home, read by export, predict, inspection and weights ---------

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch grid in the encoder's sequence (the class and
        distillation tokens, registers): the config's rule, ViTConfig.num_prefix_tokens."""
        return self.config.num_prefix_tokens

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

    def with_preprocessing(self, include_preprocessing: bool = True):
        """This model taking pixels 0..255 (or, with False, [-1, 1]): a new
        ViT with the same config and weights (compiled as this one, with a
        fresh optimizer); `self` when it already takes them."""
        if self.include_preprocessing == bool(include_preprocessing):
            return self
        config = self.get_config()
        config["include_preprocessing"] = bool(include_preprocessing)
        other = type(self).from_config(config)
        other.set_weights(self.get_weights())
        other.check_input_range = self.check_input_range
        compile_config = self.get_compile_config() if self.compiled else None
        if compile_config:
            other.compile_from_config(compile_config)
        return other

    def with_image_size(self, image_size=None, dynamic_image_size=None, dynamic_image_pad=None):
        """This model at another `image_size` (position weights resized by the
        loader's rule) and/or taking any size (dynamic_image_size, see the
        class docstring): a new ViT with the same config and weights; `self`
        when nothing changes. None keeps a setting as it is."""
        config = self.get_config()
        changes = {"image_size": None if image_size is None else list(_image_size(image_size)),
                   "dynamic_image_size": dynamic_image_size, "dynamic_image_pad": dynamic_image_pad}
        changes = {key: value for key, value in changes.items() if value is not None and value != config[key]}
        if not changes:
            return self
        other = type(self).from_config({**config, **changes})
        from keras_vit.weights.npz import checkpoint_params, load_checkpoint

        load_checkpoint(other, checkpoint_params(self), old_grid=self.grid_size)
        other.check_input_range = self.check_input_range
        return other

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

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid."""
        s = self.config.total_stride
        return (self.image_size[0] // s, self.image_size[1] // s)

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

    def get_config(self):
        return {
            "config": self.config.to_dict(),
            "image_size": list(self.image_size),
            "num_classes": self.num_classes,
            "include_top": self.include_top,
            "include_preprocessing": self.include_preprocessing,
            "classifier_activation": keras.activations.serialize(keras.activations.get(self.classifier_activation))
            if self.classifier_activation is not None else None,
            "num_channels": self.num_channels,
            "labels": self.labels,
            "dynamic_image_size": self.dynamic_image_size,
            "dynamic_image_pad": self.dynamic_image_pad,
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("classifier_activation"), dict):
            config["classifier_activation"] = keras.activations.deserialize(config["classifier_activation"])
        return cls(**config)


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


def rematerialize_blocks(model, enabled: bool = True) -> int:
    """Makes every encoder block of `model` keep only its input for the
    backward pass and recompute the rest there (EncoderBlock.rematerialize):
    activation memory of the encoder falls from all blocks' internals to one
    block's, for about one more forward pass per step. Returns the number of
    blocks. Outputs and gradients are unchanged (dropout masks included)."""
    blocks = encoder_blocks(model)
    for block in blocks:
        block.rematerialize = bool(enabled)
    return len(blocks)


def fuse_gelu(model, enabled: bool = True) -> int:
    """Makes every MLP block of `model` take the fused GELU kernel when
    training on TensorFlow (MlpBlock.fused_gelu, keras_vit.layers.fused):
    for steps that are not XLA-compiled. Returns the number of MLP blocks.
    Outputs and gradients are unchanged up to float32 rounding."""
    mlps = [block.mlp for block in encoder_blocks(model)]
    for mlp in mlps:
        mlp.fused_gelu = bool(enabled)
    return len(mlps)


def encoder_blocks(model) -> list:
    """Every EncoderBlock of the ViTs in `model` (the model itself, or ViTs
    nested in it as layers, e.g. a task's wrapper), in order, from each
    encoder's own list of its blocks: no walk through Keras' private layer
    tracking."""
    return [block for vit in vits_in(model) for block in vit.encoder.blocks]


def vits_in(model, seen=None) -> list:
    """The ViTs in `model`: the model itself, or every ViT nested in it as a
    layer (a task's wrapper, e.g. masked patch prediction), in layer order."""
    seen = set() if seen is None else seen
    if id(model) in seen:
        return []
    seen.add(id(model))
    if isinstance(model, ViT):
        return [model]
    # keras.Model.layers (public) lists a model's direct sub-layers, subclassed models' included.
    return [vit for layer in getattr(model, "layers", ()) for vit in vits_in(layer, seen)]


def weight_parts_of(model) -> dict:
    """{variable path: keras_vit.weights.parts.WeightPart} for every weight of
    every ViT in `model`; a wrapper's own layers (a task's head) are not listed."""
    return {path: part for vit in vits_in(model) for path, part in weight_parts.weight_parts(vit).items()}


# Every layer a ViT may hold, by its handle on the model (`ViT.<part>`), in the order the image
# flows through them; None where the config has none. Their groups: keras_vit.weights.parts.
PARTS = tuple(weight_parts.HANDLES)


def _build_layers(config, grid, include_top, num_classes, classifier_activation, include_preprocessing,
                  dynamic_image_size, dynamic_image_pad):
    """The ViT's layers for `config`, named as the official checkpoint's modules
    (keras_vit.weights.layout maps them), as a namespace of PARTS."""
    stride = config.total_stride
    positioned, prefix = config.num_positioned_prefix_tokens, config.num_prefix_tokens
    epsilon = config.layer_norm_epsilon
    parts = dict.fromkeys(PARTS)
    if include_preprocessing:
        parts["preprocessing"] = _preprocessing_layer(config.pixel_normalization)
    if dynamic_image_pad:
        parts["padding"] = vit_layers.PadToMultiple(stride, name="dynamic_pad")
    if config.resnet:
        parts["resnet"] = vit_layers.ResNetStem(config.resnet.num_layers, config.resnet.width_factor, name="resnet")
    parts["patch_embedding"] = vit_layers.PatchEmbedding(config.hidden_size, config.patch_size,
                                                         use_bias=config.patch_bias, name="embedding")
    if config.classifier in ("token", "token_gap"):
        parts["class_token"] = vit_layers.ClassToken(name="cls")
    if config.distillation_token:
        parts["distillation_token"] = vit_layers.InsertTokens(1, offset=1, name="dist_token")
    parts["position_embedding"] = _position_embedding(config, grid, stride if dynamic_image_size else None)
    if config.num_register_tokens:
        parts["register_tokens"] = vit_layers.InsertTokens(config.num_register_tokens, offset=positioned,
                                                           name="reg_tokens")
    parts["embedding_dropout"] = (
        vit_layers.PatchDropout(config.patch_dropout, prefix, config.dropout_rate, name="embedding_dropout")
        if config.patch_dropout else keras.layers.Dropout(config.dropout_rate, name="embedding_dropout"))
    if config.pre_norm:
        parts["pre_norm"] = keras.layers.LayerNormalization(epsilon=epsilon, name="pre_norm")
    parts["encoder"] = vit_layers.Encoder(
        config.num_layers, config.num_heads, config.mlp_dim, config.dropout_rate, config.attention_dropout_rate,
        config.stochastic_depth_rate, epsilon, config.gelu_approximate,
        relative_position_grid=grid if config.position_embedding == "relative" else None,
        num_prefix_tokens=prefix, layer_scale_init=config.layer_scale_init,
        mlp_activation=config.mlp_activation, final_norm=config.final_norm == "tokens", name="Transformer")
    if config.classifier == "map":
        parts["pooling"] = vit_layers.MAPHead(config.num_heads, config.mlp_dim, epsilon, config.gelu_approximate,
                                              config.mlp_activation, name="MAPHead_0")
    else:
        # A "gap" model's prefix holds registers only; None keeps older files' config as it was.
        parts["pooling"] = vit_layers.TokenPooling(config.classifier, num_prefix_tokens=prefix, name="pooling")
    if config.final_norm == "pooled":
        parts["pooled_norm"] = keras.layers.LayerNormalization(epsilon=epsilon, name="pooled_norm")
    if config.projection_size:
        parts["projection"] = keras.layers.Dense(config.projection_size, use_bias=False, name="projection")
    if config.representation_size:
        parts["pre_logits"] = keras.layers.Dense(config.representation_size, activation="tanh", name="pre_logits")
    if include_top and config.distillation_head:
        parts["head"] = vit_layers.DistillationHead(num_classes, classifier_activation, name="head")
    elif include_top:
        # Zero-initialised: the fine-tuning convention of the official code.
        # float32 so that logits stay float32 under mixed precision.
        parts["head"] = keras.layers.Dense(num_classes, kernel_initializer="zeros",
                                           activation=classifier_activation, name="head", dtype="float32")
    return types.SimpleNamespace(**parts)


def _preprocessing_layer(normalization):
    """Pixels 0..255 -> what the weights expect (keras_vit.images.NORMALIZATIONS),
    inside the model (include_preprocessing=True)."""
    if normalization == "minus_one_to_one":  # the layer every earlier .keras file holds
        return keras.layers.Rescaling(1.0 / 127.5, offset=-1.0, name="preprocessing")
    from keras_vit.images import NORMALIZATIONS

    mean, std = (np.asarray(v, np.float64) for v in NORMALIZATIONS[normalization])
    return keras.layers.Rescaling(list(1.0 / std), offset=list(-mean / std), name="preprocessing")


def embed_images(images, parts, training=None, patch_hook=None):
    """The one embedding path: images -> the tokens the encoder sees (B, T, D).

    [preprocessing] -> [padding] -> [ResNet stem] -> patch embedding ->
    [patch_hook] -> [class token] -> [distillation token] -> [+ position
    embedding] -> [registers] -> dropout -> [pre-norm]. `parts` holds the
    layers (a ViT, or the namespace its constructor builds; optional ones
    None). A dynamic position embedding (one with a `stride`) is also given
    the images, whose size sets its grid. The ViT builds its graph with it
    (symbolic tensors) and `ViT.embed` calls it with the model's layers
    (eager or traced), so the two cannot disagree. training=None leaves the
    mode to the caller's context (inside the functional graph: the model's call).
    """
    x = parts.preprocessing(images) if parts.preprocessing is not None else images
    if parts.padding is not None:
        x = parts.padding(x)  # (B, H', W', C), multiples of the stride
    pixels = x
    if parts.resnet is not None:
        x = parts.resnet(x, training=training)  # (B, H/s, W/s, C)
    x = parts.patch_embedding(x)  # (B, N, D)
    if patch_hook is not None:
        x = patch_hook(x)
    for prefix in (parts.class_token, parts.distillation_token):
        if prefix is not None:
            x = prefix(x)  # (B, 1 [+ 1] + N, D)
    position_embedding = parts.position_embedding
    if position_embedding is not None:
        dynamic = getattr(position_embedding, "stride", None) is not None
        x = position_embedding(x, pixels) if dynamic else position_embedding(x)
    if parts.register_tokens is not None:
        x = parts.register_tokens(x)  # after the positions: registers have none
    x = parts.embedding_dropout(x, training=training)
    return parts.pre_norm(x) if parts.pre_norm is not None else x


def read_out(tokens, parts):
    """The encoded tokens (B, T, D) -> the model's output: the head's (logits,
    or probabilities with its activation), or without a head the pooled image
    embedding (after [pooled norm], [projection], [pre-logits])."""
    if isinstance(parts.head, vit_layers.DistillationHead):
        return parts.head(tokens)  # reads the class and distillation tokens itself
    x = pooled_embedding(tokens, parts)
    return parts.head(x) if parts.head is not None else x


def pooled_embedding(tokens, parts):
    """pooling -> [pooled norm] -> [projection] -> [pre-logits]: the image
    embedding a head reads (what transformers calls pooler_output, or CLIP's
    image_embeds)."""
    return embedding_of_pooled(read_pooled(tokens, parts), parts)


def read_pooled(tokens, parts):
    """The read-out: pooling -> [pooled norm] (B, D), or (B, 2 D) for "token_gap"."""
    x = parts.pooling(tokens)
    return parts.pooled_norm(x) if parts.pooled_norm is not None else x


def embedding_of_pooled(pooled, parts):
    """The read-out -> [projection] -> [pre-logits]: what a head reads."""
    x = pooled
    for layer in (parts.projection, parts.pre_logits):
        if layer is not None:
            x = layer(x)
    return x


def head_layers(model) -> list:
    """The Dense layers making a ViT's logits: its head, or DeiT's pair
    (DistillationHead: .head and .head_dist); [] without a head."""
    head = model.head
    if head is None:
        return []
    if isinstance(head, vit_layers.DistillationHead):
        return [head.head, head.head_dist]
    return [head]


def block_indices(num_layers, indices=None):
    """forward_intermediates' `indices` -> sorted block numbers: None for all,
    an int n for the last n, a list of indices (negative from the end)."""
    if indices is None:
        return list(range(num_layers))
    if isinstance(indices, int):
        if not 0 < indices <= num_layers:
            raise UserError(f"indices={indices} asks for the last {indices} blocks of {num_layers}: use 1 to "
                            f"{num_layers}, or a list of block indices.")
        return list(range(num_layers - indices, num_layers))
    chosen = []
    for index in indices:
        if not -num_layers <= int(index) < num_layers:
            raise UserError(f"Block index {index} is out of range for {num_layers} blocks (0 to {num_layers - 1}, "
                            f"or negative from the end).")
        chosen.append(int(index) % num_layers)
    return sorted(set(chosen))


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


def output_activation(model):
    """`model.output_activation` for a ViT; for any other Keras model, that
    of its last layer (a Dense with an activation, an Activation or Softmax
    layer): "softmax", "sigmoid" or None (logits)."""
    if isinstance(model, ViT):
        return model.output_activation
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if isinstance(last, (keras.layers.Softmax, keras.layers.Activation)):
        return activation_name(last)
    return activation_name(getattr(last, "activation", None))


def returns_probabilities(model) -> bool:
    """True when `model`'s outputs are probabilities already (its head ends in
    softmax or sigmoid: `output_activation`); False for logits."""
    return output_activation(model) is not None


def _position_embedding(config, grid, stride=None):
    """The layer that adds the config's kind of position embedding to the
    tokens, or None when nothing is added ("relative" lives in the attention,
    "none" is none). Every absolute kind is named "posembed_input", the
    official module name. `stride` (pixels per token) makes it follow the
    images' grid (a dynamic model); registers come after it, so its prefix is
    the class and distillation tokens."""
    kind, prefix = config.position_embedding, config.num_positioned_prefix_tokens
    if kind == "learned_1d":
        interpolation = config.position_interpolation
        extra = {} if interpolation == "linear" else {"interpolation": interpolation}
        return vit_layers.PositionEmbedding(grid, prefix, stride=stride, name="posembed_input", **extra)
    if kind == "learned_2d":
        return vit_layers.PositionEmbedding2D(grid, prefix, stride=stride, name="posembed_input")
    if kind == "sincos_2d":
        return vit_layers.SinCosPositionEmbedding2D(grid, prefix, stride=stride, name="posembed_input")
    return None


def _family_name(config: ViTConfig) -> str:
    """"ViT", or the descendant its variant names ("DINOv2-reg", "CLIP", ...)."""
    try:
        name = canonical_name(config)
    except ValueError:
        return "ViT"
    return name.rsplit("-", 1)[0] if "-" in name else "ViT"


def _default_name(config: ViTConfig) -> str:
    try:
        return "vit_" + canonical_name(config).lower().replace("/", "").replace("+", "_").replace("-", "_")
    except ValueError:
        return "vit"
