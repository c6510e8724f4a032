"""The Vision Transformer model: layers assembled into a Keras functional model."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.config import ViTConfig
from keras_vit.labels import check_labels
from keras_vit.variants import canonical_name, get_variant
from keras_vit.errors import UserError


# What a model takes, by whether it scales pixels itself (ViT.input_range).
MODEL_RANGE = "[-1, 1]"
PIXEL_RANGE = "0..255"
# Inputs of a [-1, 1] model that are all >= 0 with a maximum above this are pixels (ViT.check_input_range).
PIXELS_ABOVE = 2.0
# Final activations whose outputs are probabilities already (ViT.output_activation): nothing goes on top.
PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


def preprocess_input(images):
    """Scales 0..255 pixels to [-1, 1], the range a ViT takes (the official
    checkpoints', and that of every model keras_vit trains) unless it was built
    with include_preprocessing=True (`model.input_range` says which)."""
    from keras_vit.images import to_model_range

    return to_model_range(ops.cast(images, "float32"))


def _image_size(image_size):
    if isinstance(image_size, int):
        return (image_size, image_size)
    size = tuple(int(s) for s in image_size)
    if len(size) != 2:
        raise UserError(f"image_size must be an int or (height, width), got {image_size!r}.")
    return size


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(keras.Model):
    """A Vision Transformer (Dosovitskiy et al., 2021), or a hybrid ResNet+ViT.

    Images (B, H, W, C) in [-1, 1] (or 0..255 with include_preprocessing)
    -> [ResNet stem] -> patches -> [class token] -> + position embedding ->
    encoder -> pooled token -> [pre-logits] -> [head]. With
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
        include_top: False returns the head's input (B, D) (the
            pre-logits output where there is a representation layer).
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
        preprocessing = (
            keras.layers.Rescaling(1.0 / 127.5, offset=-1.0, name="preprocessing")
            if include_preprocessing else None
        )
        resnet = (
            vit_layers.ResNetStem(config.resnet.num_layers, config.resnet.width_factor, name="resnet")
            if config.resnet else None
        )
        patch_embedding = vit_layers.PatchEmbedding(config.hidden_size, config.patch_size, name="embedding")
        num_prefix_tokens = prefix_tokens_of(config)
        class_token = vit_layers.ClassToken(name="cls") if num_prefix_tokens else None
        grid = (height // stride, width // stride)
        position_embedding = _position_embedding(config.position_embedding, grid, num_prefix_tokens,
                                                 stride if dynamic_image_size else None)
        padding = vit_layers.PadToMultiple(stride, name="dynamic_pad") if dynamic_image_pad else None
        embedding_dropout = (
            vit_layers.PatchDropout(config.patch_dropout, num_prefix_tokens, config.dropout_rate,
                                    name="embedding_dropout")
            if config.patch_dropout else keras.layers.Dropout(config.dropout_rate, name="embedding_dropout"))
        encoder = vit_layers.Encoder(
            config.num_layers,
            config.num_heads,
            config.mlp_dim,
            config.dropout_rate,
            config.attention_dropout_rate,
            config.stochastic_depth_rate,
            config.layer_norm_epsilon,
            config.gelu_approximate,
            relative_position_grid=grid if config.position_embedding == "relative" else None,
            num_prefix_tokens=num_prefix_tokens,
            name="Transformer",
        )
        pooling = vit_layers.TokenPooling(config.classifier, name="pooling")
        pre_logits = (
            keras.layers.Dense(config.representation_size, activation="tanh", name="pre_logits")
            if config.representation_size else None
        )
        # Zero-initialised: the fine-tuning convention of the official code.
        # float32 so that logits stay float32 under mixed precision.
        head = (
            keras.layers.Dense(
                num_classes, kernel_initializer="zeros", activation=classifier_activation,
                name="head", dtype="float32",
            )
            if include_top else None
        )

        # === Functional model ===
        input_size = (None, None) if dynamic_image_size else (height, width)
        images = keras.Input((*input_size, int(num_channels)), name="images")
        x = embed_images(images, preprocessing, resnet, patch_embedding, class_token, position_embedding,
                         embedding_dropout, padding=padding)
        x = encoder(x)
        x = pooling(x)  # (B, D)
        if pre_logits:
            x = pre_logits(x)
        outputs = head(x) if head else x
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
        # Named handles for porting, inspection and export (never list positions).
        self.preprocessing = preprocessing
        self.padding = padding
        self.resnet = resnet
        self.patch_embedding = patch_embedding
        self.class_token = class_token
        # The layer adding positions to the tokens; None for "relative" and "none".
        self.position_embedding = position_embedding
        self.embedding_dropout = embedding_dropout
        self.encoder = encoder
        self.pooling = pooling
        self.pre_logits = pre_logits
        self.head = head

        if weights is not None:
            from keras_vit.weights import load_weights

            load_weights(self, weights)

    def embed(self, images, training=False, patch_hook=None):
        """Images -> the token sequence the encoder sees (B, T, D), through
        the model's own layers (see `embed_images`, which also built the
        model's graph). `patch_hook(tokens) -> tokens` may change the patch
        tokens (B, N, D) before the class token and position embedding
        (masked patch prediction corrupts them there)."""
        return embed_images(images, self.preprocessing, self.resnet, self.patch_embedding, self.class_token,
                            self.position_embedding, self.embedding_dropout, training=training,
                            patch_hook=patch_hook, padding=self.padding)

    def forward_intermediates(self, images, training=False, attention=True):
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
            "tokens": (B, T, D) the encoder's output (after its LayerNorm);
            "pooled": (B, D) the read-out token (class token, or the mean for "gap");
            "pre_logits": (B, R or D) the head's input (= "pooled" without a
                representation layer);
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
        out["pooled"] = self.pooling(out["tokens"])
        out["pre_logits"] = self.pre_logits(out["pooled"]) if self.pre_logits is not None else out["pooled"]
        if self.head is not None:
            out["logits"] = self.head(out["pre_logits"])
        return out

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
        """Tokens before the patch grid in the encoder's sequence: 1 (the class
        token) for classifier="token", 0 for "gap" (`prefix_tokens_of`)."""
        return prefix_tokens_of(self.config)

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
        """"0..255" (pixels, scaled inside) or "[-1, 1]" (keras_vit.preprocess_input(pixels))."""
        return PIXEL_RANGE if self.takes_raw_pixels else MODEL_RANGE

    @property
    def input_description(self) -> str:
        """One line: the input shape and range, and how to get there from pixels."""
        shape = f"(B, {self.image_size[0]}, {self.image_size[1]}, {self.num_channels})"
        if self.dynamic_image_size:
            sizes = "any size" if self.dynamic_image_pad else f"multiples of {self.config.total_stride}"
            trained = "x".join(str(side) for side in self.image_size)
            shape = f"(B, H, W, {self.num_channels}), H and W {sizes} (trained at {trained})"
        if self.takes_raw_pixels:
            return f"images {shape} of pixels {PIXEL_RANGE} (scaled to {MODEL_RANGE} inside)"
        return f"images {shape} in {MODEL_RANGE} (keras_vit.preprocess_input(pixels {PIXEL_RANGE}))"

    def describe(self) -> str:
        """A few lines saying what the model is and what it takes and returns."""
        config = self.config
        grid = self.grid_size
        hybrid = f", ResNet-{config.resnet.num_layers} stem" if config.resnet else ""
        lines = [
            f"{self.name}: ViT, {config.num_layers} blocks of width {config.hidden_size}, {config.num_heads} heads"
            f"{hybrid}; {config.total_stride}x{config.total_stride}-pixel patches, {grid[0]}x{grid[1]} grid; "
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
        if low >= 0 and high > PIXELS_ABOVE:
            raise UserError(
                f"{self.name} takes images in {MODEL_RANGE}, but got values from {low:g} to {high:g}, which look "
                f"like pixels {PIXEL_RANGE}: pass keras_vit.preprocess_input(pixels), or use "
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
    return [block for vit in _vits_in(model) for block in vit.encoder.blocks]


def _vits_in(model, seen=None) -> list:
    seen = set() if seen is None else seen
    if id(model) in seen:
        return []
    seen.add(id(model))
    if isinstance(model, ViT):
        return [model]
    # keras.Model.layers (public) lists a model's direct sub-layers, subclassed models' included.
    return [vit for layer in getattr(model, "layers", ()) for vit in _vits_in(layer, seen)]


def embed_images(images, preprocessing, resnet, patch_embedding, class_token, position_embedding,
                 embedding_dropout, training=None, patch_hook=None, padding=None):
    """The one embedding path: images -> the tokens the encoder sees (B, T, D).

    [preprocessing] -> [padding] -> [ResNet stem] -> patch embedding ->
    [patch_hook] -> [class token] -> [+ position embedding] -> dropout. A
    dynamic position embedding (one with a `stride`) is also given the
    images, whose size sets its grid. The ViT builds its
    graph with it (symbolic tensors) and `ViT.embed` calls it with the
    model's layers (eager or traced), so the two cannot disagree.
    Optional layers are None. training=None leaves the mode to the caller's
    context (inside the functional graph: the model's call).
    """
    x = preprocessing(images) if preprocessing is not None else images
    if padding is not None:
        x = padding(x)  # (B, H', W', C), multiples of the stride
    pixels = x
    if resnet is not None:
        x = resnet(x, training=training)  # (B, H/s, W/s, C)
    x = patch_embedding(x)  # (B, N, D)
    if patch_hook is not None:
        x = patch_hook(x)
    if class_token is not None:
        x = class_token(x)  # (B, N + 1, D)
    if position_embedding is not None:
        dynamic = getattr(position_embedding, "stride", None) is not None
        x = position_embedding(x, pixels) if dynamic else position_embedding(x)
    return embedding_dropout(x, training=training)


def prefix_tokens_of(config: ViTConfig) -> int:
    """The one rule for the tokens before the patch grid: a class token with
    classifier="token", none with "gap" (`ViT.num_prefix_tokens`)."""
    return 1 if config.classifier == "token" else 0


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


def _position_embedding(kind, grid, num_prefix_tokens, stride=None):
    """The layer that adds `kind` of position embedding to the tokens, or None
    when nothing is added ("relative" lives in the attention, "none" is none).
    Every absolute kind is named "posembed_input", the official module name.
    `stride` (pixels per token) makes it follow the images' grid (a dynamic model)."""
    if kind == "learned_1d":
        return vit_layers.PositionEmbedding(grid, num_prefix_tokens, stride=stride, name="posembed_input")
    if kind == "learned_2d":
        return vit_layers.PositionEmbedding2D(grid, num_prefix_tokens, stride=stride, name="posembed_input")
    if kind == "sincos_2d":
        return vit_layers.SinCosPositionEmbedding2D(grid, num_prefix_tokens, stride=stride, name="posembed_input")
    return None


def _default_name(config: ViTConfig) -> str:
    try:
        return "vit_" + canonical_name(config).lower().replace("/", "").replace("+", "_")
    except ValueError:
        return "vit"
