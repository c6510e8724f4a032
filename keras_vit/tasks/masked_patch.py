"""Self-supervised pre-training by masked patch prediction (paper, Sec. 4.6 and App. B.1.2).

The objective, as the paper describes it: 50% of each image's patch
embeddings are corrupted (before the class token and the position embedding
are added) -- of those, 80% are replaced by a learned [mask] embedding, 10% by
the embedding of another patch, 10% kept -- and the encoder's output at every
corrupted position predicts that patch's mean colour, quantised to 3 bits per
channel: 8**3 = 512 classes for RGB. Labels are never read.

Grayscale images (1 channel) get 8**1 = 8 classes: the patch's mean intensity
quantised to 3 bits. Replicating the channel to RGB would give exactly the same
information (the 512-class index of a gray patch is fixed by its one 3-bit
level, only the 8 "diagonal" colours r = g = b can occur), so 8 classes is the
same objective without 504 logits that can never be a target.

    from keras_vit import training
    config = training.TrainConfig.create("masked_patch", model="S/16", dataset="folder:/data/unlabelled",
                                         workdir="runs/mpp", fewshot_shots=(1, 5, 10, 25))
    results = training.train(config)  # the recipe picks MaskedPatchTask (tasks.RECIPE_TASKS)

The run's model.keras is the classification ViT alone (the colour head is
dropped), so `--weights runs/mpp` starts a fine-tuning run from its encoder.
With few-shot shots set, the trainer evaluates the pre-trained features
(`feature_model`) and, in the same run, the same architecture at the run's
random initialisation (`baseline_feature_model`): results.json "fewshot"
and "fewshot_random_init".
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_vit import images as images_lib
from keras_vit.layers.patch_corruption import PatchCorruption
from keras_vit.model import ViT, block_inputs
from keras_vit.tasks.base import Task
from keras_vit.tasks.fields import IMAGE
from keras_vit.tasks.classification import ClassificationTask
from keras_vit.tasks.metrics import top_k_hits
from keras_vit.variants import get_variant
from keras_vit.weights import parts as weight_parts

COLOUR_BITS = 3

# App. B.1.2: "Adam, with a base learning rate of 2e-4, warmup of 10k steps and
# cosine learning rate decay", batch 4096, 1M steps (about 14 epochs of JFT).
# Not given there, so chosen here: no weight decay (plain Adam), clipping at
# global norm 1 (as for every other pre-training run of App. B.1), the usual
# Inception crop + flip, resolution 224, no dropout, no representation layer
# (the objective reads the patch tokens, never the pooled one).


def num_colour_classes(num_channels: int, bits: int = COLOUR_BITS) -> int:
    """(2**bits)**channels: 512 for RGB, 8 for grayscale."""
    return (2 ** bits) ** int(num_channels)


def mean_colour_targets(images, patch_size: int, bits: int = COLOUR_BITS):
    """The class of each patch's quantised mean colour.

    Args:
        images: (B, H, W, C) in [-1, 1] (the trainer's range).
        patch_size: side of the image region behind one token (patch size
            times the ResNet stride for a hybrid).
        bits: bits per channel.
    Returns:
        (B, N) int32 in [0, (2**bits)**C), row-major over the patch grid like
        the tokens; for RGB, index = r * 64 + g * 8 + b with r, g, b the
        channel means of the patch mapped to [0, 1] and quantised to
        floor(mean * 8), clipped to 7.
    """
    images = tf.convert_to_tensor(images, tf.float32)
    _, height, width, channels = images.shape
    rows, cols = height // patch_size, width // patch_size
    patches = tf.reshape(images, [-1, rows, patch_size, cols, patch_size, channels])
    means = tf.reduce_mean(patches, axis=[2, 4])  # (B, rows, cols, C)
    levels = 2 ** bits
    quantised = tf.clip_by_value(tf.floor((means + 1.0) / 2.0 * levels), 0, levels - 1)
    weights = tf.constant([levels ** (channels - 1 - c) for c in range(channels)], tf.float32)
    index = tf.reduce_sum(quantised * weights, axis=-1)  # (B, rows, cols)
    return tf.reshape(tf.cast(index, tf.int32), [-1, rows * cols])


def in_model_range(images, normalization="minus_one_to_one"):
    """Model inputs of `normalization` (keras_vit.images.normalize) -> the same
    images in [-1, 1], which `mean_colour_targets` quantises (the identity for [-1, 1])."""
    if normalization == "minus_one_to_one":
        return images
    mean, std = images_lib.NORMALIZATIONS[normalization]
    pixels = tf.cast(images, tf.float32) * tf.constant(std, tf.float32) + tf.constant(mean, tf.float32)
    return images_lib.to_model_range(pixels)


def masked_patch_loss(logits, targets, corrupted):
    """Per-example loss and metrics over the corrupted positions only.

    Args:
        logits: (B, N, K) colour logits at every patch position.
        targets: (B, N) int colour classes.
        corrupted: (B, N) 1 where the patch was corrupted, else 0.
    Returns:
        (loss (B,), {"accuracy": (B,), "top5": (B,)}): each the mean over the
        example's corrupted patches of the cross-entropy, top-1 and top-5 hit.
    """
    logits = tf.cast(logits, tf.float32)
    corrupted = tf.cast(corrupted, tf.float32)
    targets = tf.cast(targets, tf.int32)
    count = tf.maximum(tf.reduce_sum(corrupted, axis=-1), 1.0)  # (B,)

    def corrupted_mean(per_patch):
        return tf.reduce_sum(tf.cast(per_patch, tf.float32) * corrupted, axis=-1) / count

    # Zero weight is not enough: 0 * inf is NaN, so the other positions'
    # logits are taken out of the graph altogether.
    keep = corrupted[..., None] > 0
    logits = tf.where(keep, logits, tf.stop_gradient(tf.zeros_like(logits)))
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)  # (B, N)
    top1, top5 = top_k_hits(logits, targets, 1), top_k_hits(logits, targets, 5)
    return corrupted_mean(cross_entropy), {"accuracy": corrupted_mean(top1), "top5": corrupted_mean(top5)}


class MaskedPatchModel(keras.Model):
    """A ViT whose patch embeddings are corrupted, with a colour head on every patch token.

    The ViT's own embedding path (`ViT.embed`) with the corruption hooked in
    between the patch embedding and the class token, then its encoder: its
    weights are the ones trained; its pooling, pre-logits and classification
    head are not used. `model.vit` is what is exported.

    Args:
        vit: a keras_vit.ViT (include_preprocessing=False).
        corruption: a PatchCorruption layer.
        num_classes: colour classes of the prediction head.
    Call: images (B, H, W, C) as the ViT takes them -> {"logits": (B, N, num_classes)
    float32, "corrupted": (B, N) 0/1, "kinds": (B, N) int32}.
    """

    def __init__(self, vit: ViT, corruption: PatchCorruption, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.vit = vit
        self.corruption = corruption
        # Its mask token stands in for patch embeddings: the stem's side for layer-wise decay.
        self.stem_layers = (corruption,)
        # float32 logits under mixed precision, as the ViT's own head.
        self.colour_head = keras.layers.Dense(num_classes, name="colour_head", dtype="float32")
        tokens_shape = (None, vit.grid_size[0] * vit.grid_size[1], vit.config.hidden_size)
        self.corruption.build(tokens_shape)
        self.colour_head.build(tokens_shape)
        # The read-out and the classifiers get no gradient here (the colour head reads the patch
        # tokens after the final norm); freezing them keeps them out of the optimizer.
        for unused in weight_parts.layers_in(vit, (weight_parts.READOUT, weight_parts.CLASSIFIER)):
            unused.trainable = False
        self.built = True

    def call(self, images, training=False):
        corruption = {}

        def corrupt(tokens):  # (B, N, D) patch tokens, before the class token
            tokens, corruption["corrupted"], corruption["kinds"] = self.corruption(tokens)
            return tokens

        x = self.vit.encoder(self.vit.embed(images, training=training, patch_hook=corrupt), training=training,
                             **block_inputs(images, self.vit, training))
        x = x[:, self.vit.num_prefix_tokens:]  # the patch tokens (B, N, D): class/distillation/register tokens off
        return {"logits": self.colour_head(x), **corruption}


def patch_features(vit: ViT) -> keras.Model:
    """Images -> mean of the encoder's output patch tokens (B, D).

    The features of the few-shot evaluation: masked patch prediction trains
    the patch tokens' representations; a class token gets no objective of its
    own (for classifier="gap" this is exactly the ViT's pooled output).
    """
    backbone = vit.backbone  # images -> (B, [prefix +] N, D)
    tokens = backbone.output[:, vit.num_prefix_tokens:]
    return keras.Model(backbone.inputs, ops.mean(tokens, axis=1), name=f"{vit.name}_patch_features")


class MaskedPatchTask(Task):
    """Masked patch prediction (see the module docstring) for the trainer.

    Args:
        corrupt_rate, mask_rate, random_rate: see PatchCorruption (the
            paper's 0.5, 0.8, 0.1 by default).
        bits: bits per channel of the colour targets (the paper's 3).
    """

    name = "masked_patch"
    fields = {"image": IMAGE}  # labels are never read
    exports_classifier = True  # model.keras is the ViT alone, its colour head dropped

    def __init__(self, corrupt_rate: float = 0.5, mask_rate: float = 0.8, random_rate: float = 0.1,
                 bits: int = COLOUR_BITS):
        self.corrupt_rate = float(corrupt_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        self.bits = int(bits)
        self._initial_weights = None

    def build_model(self, plan):
        # A classification-ready ViT (its head is what fine-tuning replaces anyway).
        num_channels = plan.num_channels
        vit = ViT(get_variant(plan.model), image_size=plan.image_size, num_classes=plan.num_classes,
                  num_channels=num_channels)
        # The run's random initialisation, for the few-shot baseline: taken
        # before any checkpoint is restored, and identical on resume (same seed).
        self._initial_weights = [np.array(w) for w in vit.get_weights()]
        corruption = PatchCorruption(self.corrupt_rate, self.mask_rate, self.random_rate, name="patch_corruption")
        return MaskedPatchModel(vit, corruption, num_colour_classes(num_channels, self.bits),
                                name="masked_patch_" + vit.name)

    def compute_loss(self, model, batch, training):
        images = batch["image"]
        outputs = model(images, training=training)
        targets = mean_colour_targets(in_model_range(images, model.vit.config.pixel_normalization),
                                      model.vit.config.total_stride, self.bits)
        return masked_patch_loss(outputs["logits"], targets, outputs["corrupted"])

    def export_model(self, model):
        # The ViT alone, float32 (the colour head and the [mask] embedding are dropped).
        return ClassificationTask().export_model(model.vit if isinstance(model, MaskedPatchModel) else model)

    def feature_model(self, model):
        return patch_features(model)

    def baseline_feature_model(self, model):
        """The same features from `model`'s architecture at this run's
        random initialisation (None if build_model was not called)."""
        if self._initial_weights is None:
            return None
        fresh = ViT.from_config(model.get_config())
        fresh.set_weights(self._initial_weights)
        return patch_features(fresh)

