"""The Vision Transformer: keras_vit.layers assembled into a Keras functional model
(`ViT`), the one path from images to tokens (`embed_images`) and the layers' handles
(`PARTS`). Its input guard, descriptions and feature read-outs are mixins of their own
modules (guard, description, readout)."""

from __future__ import annotations

import types

import keras
import numpy as np
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.config import ViTConfig
from keras_vit.utils.labels import check_labels
from keras_vit.variants import canonical_name, get_variant
from keras_vit.errors import UserError
from keras_vit.weights import parts as weight_parts
from keras_vit.model.description import Description
from keras_vit.model.guard import InputGuard
from keras_vit.model.readout import FeatureAPI, block_inputs, read_out


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
class ViT(InputGuard, Description, FeatureAPI, keras.Model):
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

    # Its public home, the package: .keras files name the class keras_vit.model.ViT, as they always have.
    __module__ = __name__.rpartition(".")[0]

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
        tokens = parts.encoder(embed_images(images, parts), **block_inputs(images, parts))
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
        if config.lora_rank:
            from keras_vit.model.lora import freeze_for_lora

            freeze_for_lora(self)

    def embed(self, images, training=False, patch_hook=None, grids=None):
        """Images -> the token sequence the encoder sees (B, T, D), through
        the model's own layers (see `embed_images`, which also built the
        model's graph). `patch_hook(tokens) -> tokens` may change the patch
        tokens (B, N, D) before the class token and position embedding
        (masked patch prediction corrupts them there); `grids` (B, 2) gives a
        padded batch each image's own positions (`call_padded`)."""
        return embed_images(images, self, training=training, patch_hook=patch_hook, grids=grids)

    def call_padded(self, images, grids, training=False):
        """The output for each image of a batch padded over different grids, as
        if each were alone (SigLIP2's NaFlex batches, keras_vit.model.naflex):
        images (B, H, W, C) with each image at the top left, grids (B, 2) its
        rows and columns of patches; `keras_vit.pad_batch` makes both."""
        from keras_vit.model.naflex import call_padded

        return call_padded(self, images, grids, training=training)

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
        if self.config.quantization:  # through the float values, rounded back to the same integers (tested)
            from keras_vit.model.quantization import dequantized, quantize

            resized = dequantized(self).with_image_size(image_size, dynamic_image_size, dynamic_image_pad)
            return quantize(resized, self.config.quantization)
        other = type(self).from_config({**config, **changes})
        from keras_vit.weights.npz import checkpoint_params, load_checkpoint

        load_checkpoint(other, checkpoint_params(self), old_grid=self.grid_size)
        other.check_input_range = self.check_input_range
        return other

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid."""
        s = self.config.total_stride
        return (self.image_size[0] // s, self.image_size[1] // s)

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
    if config.patch_norm:
        parts["patch_norm"] = vit_layers.make_norm(config.norm, epsilon, "embedding_norm")
    if config.has_class_token:
        parts["class_token"] = vit_layers.ClassToken(name="cls")
    if config.distillation_token:
        parts["distillation_token"] = vit_layers.InsertTokens(1, offset=1, name="dist_token")
    parts["position_embedding"] = _position_embedding(config, grid, stride if dynamic_image_size else None)
    if config.position_embedding == "rope":
        parts["rotary_embedding"] = vit_layers.RotaryEmbedding2D(
            config.hidden_size // config.num_heads, stride, config.rope_theta, pad=dynamic_image_pad,
            shift=config.rope_shift, jitter=config.rope_jitter, rescale=config.rope_rescale, name="rotary_embedding")
    if config.num_register_tokens:
        parts["register_tokens"] = vit_layers.InsertTokens(config.num_register_tokens, offset=positioned,
                                                           name="reg_tokens")
    parts["embedding_dropout"] = (
        vit_layers.PatchDropout(config.patch_dropout, prefix, config.dropout_rate, name="embedding_dropout")
        if config.patch_dropout else keras.layers.Dropout(config.dropout_rate, name="embedding_dropout"))
    if config.pre_norm:
        parts["pre_norm"] = vit_layers.make_norm(config.norm, epsilon, "pre_norm")
    parts["encoder"] = vit_layers.Encoder(
        config.num_layers, config.num_heads, config.mlp_dim, config.dropout_rate, config.attention_dropout_rate,
        config.stochastic_depth_rate, epsilon, config.gelu_approximate,
        relative_position_grid=grid if config.position_embedding == "relative" else None,
        num_prefix_tokens=prefix, layer_scale_init=config.layer_scale_init,
        mlp_activation=config.mlp_activation, final_norm=config.final_norm == "tokens", lora=config.lora,
        quantization=config.quantization, norm=config.norm, projection_biases=config.projection_biases,
        name="Transformer")
    if config.classifier == "map":
        parts["pooling"] = vit_layers.MAPHead(config.num_heads, config.mlp_dim, epsilon, config.gelu_approximate,
                                              config.mlp_activation, name="MAPHead_0")
    elif config.classifier == "attention_pool":
        # Its key and value biases follow the blocks' (AIMv2's qkv_bias); its output always has one.
        parts["pooling"] = vit_layers.AttentionPoolingHead(config.num_heads, use_bias="key" in config.projection_biases,
                                                           name="AttentionPool_0")
    else:
        # A "gap" model's prefix (registers, a class token that only attends) is left out of the mean;
        # None keeps older files' config as it was.
        parts["pooling"] = vit_layers.TokenPooling(config.classifier, num_prefix_tokens=prefix, name="pooling")
    if config.final_norm == "pooled":
        parts["pooled_norm"] = vit_layers.make_norm(config.norm, epsilon, "pooled_norm")
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


def embed_images(images, parts, training=None, patch_hook=None, grids=None):
    """The one embedding path: images -> the tokens the encoder sees (B, T, D).

    [preprocessing] -> [padding] -> [ResNet stem] -> patch embedding ->
    [patch norm] -> [patch_hook] -> [class token] -> [distillation token] -> [+ position
    embedding] -> [registers] -> dropout -> [pre-norm]. `parts` holds the
    layers (a ViT, or the namespace its constructor builds; optional ones
    None). A dynamic position embedding (one with a `stride`) is also given
    the images, whose size sets its grid. The ViT builds its graph with it
    (symbolic tensors) and `ViT.embed` calls it with the model's layers
    (eager or traced), so the two cannot disagree. training=None leaves the
    mode to the caller's context (inside the functional graph: the model's call).
    grids (B, 2): a padded batch's own grids (ViT.call_padded, `parts` the ViT):
    each image gets its table resized to its grid (keras_vit.model.naflex).
    """
    x = parts.preprocessing(images) if parts.preprocessing is not None else images
    if parts.padding is not None:
        x = parts.padding(x)  # (B, H', W', C), multiples of the stride
    pixels = x
    if parts.resnet is not None:
        x = parts.resnet(x, training=training)  # (B, H/s, W/s, C)
    x = parts.patch_embedding(x)  # (B, N, D)
    if parts.patch_norm is not None:
        x = parts.patch_norm(x)
    if patch_hook is not None:
        x = patch_hook(x)
    for prefix in (parts.class_token, parts.distillation_token):
        if prefix is not None:
            x = prefix(x)  # (B, 1 [+ 1] + N, D)
    position_embedding = parts.position_embedding
    if position_embedding is not None and grids is not None:  # a padded batch: each image its own table
        from keras_vit.model.naflex import positions_per_image

        rows, cols = (int(side) // parts.config.total_stride for side in pixels.shape[1:3])
        x = x + ops.cast(positions_per_image(position_embedding, grids, rows, cols), x.dtype)
    elif position_embedding is not None:
        dynamic = getattr(position_embedding, "stride", None) is not None
        x = position_embedding(x, pixels) if dynamic else position_embedding(x)
    if parts.register_tokens is not None:
        x = parts.register_tokens(x)  # after the positions: registers have none
    x = parts.embedding_dropout(x, training=training)
    return parts.pre_norm(x) if parts.pre_norm is not None else x


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


def _default_name(config: ViTConfig) -> str:
    try:
        return "vit_" + canonical_name(config).lower().replace("/", "").replace("+", "_").replace("-", "_")
    except ValueError:
        return "vit"
