"""The Task interface: what is learned. The training loop knows only this.

A Task builds the model and turns a batch into per-example losses and
metrics; the loop handles distribution, accumulation, clipping, mixed
precision, checkpoints and evaluation. Batches are dicts from
training/data.py (built from the run's plan): "image" (B, H, W, C) scaled as the model takes it ([-1, 1],
or its ViTConfig.pixel_normalization: keras_vit.images.normalize), "label" (B,) int32, and,
in evaluation, "weight" (B,) (0 for padding).
"""

from __future__ import annotations

from typing import Dict, Tuple

import keras
import tensorflow as tf


class Task:
    """The interface. Per-example values are summed over the global batch
    and divided by its size by the loop (so losses average over it)."""

    name = "task"

    @classmethod
    def from_train_config(cls, config) -> "Task":
        """The task as a TrainConfig asks for it (override to read recipe fields)."""
        return cls()

    def build_model(self, model_config, image_size, num_classes, num_channels) -> keras.Model:
        """The model this task trains, built for the data (its image size, classes and
        channels); the trainer builds it under the strategy's scope."""
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
