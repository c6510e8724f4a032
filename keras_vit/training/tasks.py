"""Tasks: what is learned. The training loop knows only this interface.

A Task builds the model and turns a batch into per-example losses and
metrics; the loop handles distribution, accumulation, clipping, mixed
precision, checkpoints and evaluation. To add a pre-training objective
(e.g. masked-patch prediction), subclass Task, override `build_model` (to add
its own head) and `compute_loss` (its own loss), and either pass an instance
to `keras_vit.training.train(config, task=MyTask())` or add it to TASKS so
that `--task NAME` finds it. Batches are dicts from training/data.py:
"image" (B, H, W, C) in [-1, 1], "label" (B,) int32, and, in evaluation,
"weight" (B,) (0 for padding).
"""

from __future__ import annotations

from typing import Dict, Tuple

import keras
import tensorflow as tf

from keras_vit.model import ViT
from keras_vit.variants import get_variant


class Task:
    """The interface. Per-example values are summed over the global batch
    and divided by its size by the loop (so losses average over it)."""

    name = "task"

    def build_model(self, model_config, image_size, num_classes, num_channels) -> keras.Model:
        raise NotImplementedError

    def compute_loss(self, model, batch, training: bool) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
        """(per-example loss (B,), {metric name: per-example value (B,)})."""
        raise NotImplementedError

    def feature_model(self, model):
        """A model from images to frozen features for the few-shot linear
        evaluation, or None if the task has none."""
        return None

    def export_model(self, model) -> keras.Model:
        """The model written to <workdir>/model.keras."""
        return model

    def baseline_feature_model(self, model):
        """Features of the same architecture at this run's random
        initialisation, evaluated beside `feature_model` as a baseline
        (results.json "fewshot_random_init"), or None."""
        return None


class ClassificationTask(Task):
    """Softmax cross-entropy (with the recipe's label smoothing) over the
    ViT's head; metrics: top-1 and top-5 accuracy."""

    name = "classification"

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = float(label_smoothing)

    def build_model(self, model_config, image_size, num_classes, num_channels):
        return ViT(get_variant(model_config), image_size=image_size, num_classes=num_classes,
                   num_channels=num_channels)

    def compute_loss(self, model, batch, training):
        logits = tf.cast(model(batch["image"], training=training), tf.float32)
        labels = batch["label"]
        num_classes = logits.shape[-1]
        targets = tf.one_hot(labels, num_classes)
        if self.label_smoothing and training:
            targets = targets * (1.0 - self.label_smoothing) + self.label_smoothing / num_classes
        loss = tf.nn.softmax_cross_entropy_with_logits(targets, logits)
        top1 = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        top5 = tf.cast(tf.nn.in_top_k(labels, logits, min(5, num_classes)), tf.float32)
        return loss, {"accuracy": top1, "top5": top5}

    def feature_model(self, model):
        # The head's input: pre-logits if the model has them, else the pooled token.
        return keras.Model(model.inputs, model.head.input if model.head is not None else model.outputs)

    def export_model(self, model):
        # A float32 copy, whatever precision trained it.
        config = model.get_config()
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy("float32")
        try:
            copy = ViT.from_config(config)
        finally:
            keras.config.set_dtype_policy(previous)
        copy.set_weights(model.get_weights())
        return copy


TASKS = {"classification": ClassificationTask}


# Recipes that train something other than classification pick their task.
RECIPE_TASKS = {"masked_patch": "masked_patch"}


def make_task(config) -> Task:
    name = config.task
    if name == "classification" and config.recipe.name in RECIPE_TASKS:
        name = RECIPE_TASKS[config.recipe.name]
    if name == "masked_patch":
        # Imported here: masked_patch.py builds on this module.
        from keras_vit.training.masked_patch import MaskedPatchTask

        return MaskedPatchTask()
    if name not in TASKS:
        raise ValueError(f"Unknown task {name!r}; known tasks: {sorted(TASKS) + ['masked_patch']}.")
    cls = TASKS[name]
    if cls is ClassificationTask:
        return cls(label_smoothing=config.recipe.label_smoothing)
    return cls()
