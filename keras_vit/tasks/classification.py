"""Image classification: softmax or sigmoid cross-entropy over the ViT's head."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from keras_vit.layers import DistillationHead
from keras_vit.model import ViT, head_layers, pooled_embedding
from keras_vit.model.lora import merge_lora
from keras_vit.tasks.base import Task
from keras_vit.tasks.fields import CLASSIFICATION_FIELDS
from keras_vit.tasks.metrics import top_k_hits
from keras_vit.variants import get_variant


def head_features(model):
    """The (B, D) image embedding the classifier reads, as a symbolic tensor
    of `model`'s graph: the model's one read-out (`pooled_embedding`: pooling,
    [pooled norm], [projection], [pre-logits]), the vector `include_top=False`
    returns (and an exported `include_top=False` model gives) and
    `forward_stages()["pre_logits"]` holds, so that few-shot figures measure
    the embedding users export.

    DeiT's distillation head reads the class and distillation tokens itself;
    its embedding is the class token's, as transformers' DeiTModel and this
    model without a head give (timm's pre-logits average the two tokens
    instead; one rule here, so that the few-shot figure and an exported
    embedding are the same vector)."""
    if model.head is None:
        return model.outputs
    if isinstance(model.head, DistillationHead):
        return pooled_embedding(model.head.input, model)  # the head's input: the encoder's tokens
    return model.head.input


class ClassificationTask(Task):
    """Cross-entropy (with the recipe's label smoothing) over the ViT's head:
    "softmax", or "sigmoid" (big_vision's sigmoid_xent: a binary
    cross-entropy per class, summed over the classes, the head bias starting
    at -log(num_classes) so that the first steps do not spend themselves
    pushing every class down). Mixed examples (Mixup / CutMix) carry
    "mix_label" and "mix_lambda": the target is lam x own one-hot + (1 - lam)
    x the partner's. Metrics: top-1 and top-5 accuracy of the example's own
    label (ties are misses, see `top_k_hits`)."""

    name = "classification"
    fields = CLASSIFICATION_FIELDS
    adapts_encoder = True
    reads_classifier_head = True
    exports_classifier = True

    def __init__(self, label_smoothing: float = 0.0, loss: str = "softmax"):
        self.label_smoothing = float(label_smoothing)
        self.loss = loss

    @classmethod
    def from_train_config(cls, config):
        return cls(label_smoothing=config.recipe.label_smoothing, loss=config.recipe.loss)

    def build_model(self, plan):
        model = ViT(get_variant(plan.model), image_size=plan.image_size, num_classes=plan.num_classes,
                    num_channels=plan.num_channels)
        if self.loss == "sigmoid":
            for dense in head_layers(model):  # the logits (DeiT's: the mean of two heads') start at -log(C)
                dense.bias.assign(tf.fill(dense.bias.shape, -math.log(plan.num_classes)))
        return model

    def targets(self, batch, num_classes, training):
        """The (batch, classes) targets: one-hot, mixed, smoothed in training."""
        targets = tf.one_hot(batch["label"], num_classes)
        if "mix_label" in batch:
            lam = tf.cast(batch["mix_lambda"], tf.float32)[:, None]
            targets = lam * targets + (1.0 - lam) * tf.one_hot(batch["mix_label"], num_classes)
        if self.label_smoothing and training:
            targets = targets * (1.0 - self.label_smoothing) + self.label_smoothing / num_classes
        return targets

    def compute_loss(self, model, batch, training):
        logits = tf.cast(model(batch["image"], training=training), tf.float32)
        labels = batch["label"]
        num_classes = logits.shape[-1]
        targets = self.targets(batch, num_classes, training)
        if self.loss == "sigmoid":
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(targets, logits), axis=-1)
        else:
            loss = tf.nn.softmax_cross_entropy_with_logits(targets, logits)
        metrics = {"accuracy": top_k_hits(logits, labels, 1)}
        if num_classes > 5:  # top-5 of 5 classes or fewer is always 1: not reported
            metrics["top5"] = top_k_hits(logits, labels, 5)
        return loss, metrics

    def feature_model(self, model):
        return keras.Model(model.inputs, head_features(model))

    def export_model(self, model):
        # A float32 copy, whatever precision trained it.
        config = model.get_config()
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy("float32")
        try:
            copy = ViT.from_config(config)
            copy.set_weights(model.get_weights())
            return merge_lora(copy)  # a LoRA run's updates merged into its kernels: a plain ViT
        finally:
            keras.config.set_dtype_policy(previous)
