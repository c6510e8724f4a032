"""The Task interface: what is learned and what comes out. The trainer, evaluate and export know only this.

A Task declares the fields of its examples (`fields`, keras_vit.tasks.fields),
builds its model from the run's plan, turns a batch into per-example losses
and metrics, says what an evaluation reports (`summarize`), what model a run
keeps (`export_model`) and what an export serves (`serving_outputs`). The
loop handles distribution, accumulation, clipping, mixed precision,
checkpoints and evaluation. Batches are dicts of the Task's fields, batched
by training/data.py (built from the run's plan): "image" (B, H, W, C) scaled
as the model takes it ([-1, 1], or its ViTConfig.pixel_normalization:
keras_vit.images.normalize), "label" (B,) int32, "mask" (B, H, W) int32, ...,
and "weight" (B,) (0 for an example that failed to decode, or padding).

To add a Task: a module in keras_vit/tasks/ (or your own package) with a
subclass that sets `name` and `fields` and overrides `build_model` and
`compute_loss`; then `train(config, task=MyTask())`, `--task
my_package.my_module:MyTask` on the command line, or an entry in TASKS.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Dict, Tuple

import keras
import numpy as np
import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.tasks.fields import CLASSIFICATION_FIELDS, FieldKind
from keras_vit.utils.console import warn


def across_replicas(values):
    """In `Task.compute_loss`, `values` (B, ...) of this replica's examples -> the same of every
    replica's examples of the step (R x B, ...): what a loss over the whole batch reads (a
    contrastive loss's negatives, a batch statistic). Gradients flow back to each replica's own
    part (tf.distribute's all_gather). One replica (or outside a strategy): `values` as they are.
    With accum_steps > 1, the micro-batch of every replica. A Task that calls it sets
    `gathers_across_replicas`, so that the plan keeps its step out of XLA where replicas gather."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return values
    return context.all_gather(values, axis=0)


def build_task_model(task, plan) -> keras.Model:
    """task.build_model(plan). A Task written before #54, whose build_model takes (model_config,
    image_size, num_classes, num_channels), is called so, with one line saying the new form."""
    if len(inspect.signature(task.build_model).parameters) == 4:
        warn(f"{type(task).__name__}.build_model(model_config, image_size, num_classes, num_channels) is the "
             f"form before keras_vit.tasks: it is called so; write build_model(self, plan) (plan.model, "
             f"plan.image_size, plan.num_classes, plan.num_channels).")
        return task.build_model(plan.model, plan.image_size, plan.num_classes, plan.num_channels)
    return task.build_model(plan)


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """What `Task.build_model` reads of a run's plan, to build a Task's model outside a run:
    task.build_model(ModelPlan(get_variant("S/16"), (224, 224), 10, 3))."""

    model: Any  # a ViTConfig
    image_size: Tuple[int, int]
    num_classes: int
    num_channels: int = 3


class Task:
    """The interface. Per-example values are summed over the global batch
    and divided by its size by the loop (so losses average over it)."""

    name = "task"
    fields: Dict[str, FieldKind] = CLASSIFICATION_FIELDS  # the fields each example carries to the model
    # Whether LoRA may adapt the encoder of this Task's model (a Task that trains the whole encoder says no).
    adapts_encoder = False
    # Whether a transformers base is read as its family's image classifier (a new head, its pooling).
    reads_classifier_head = False
    # Whether compute_loss reads every replica's examples (across_replicas): such a step runs without XLA
    # under several replicas (an XLA program on one device holds no collective of the others).
    gathers_across_replicas = False
    # Whether the run's model.keras is a ViT classifier (predict, evaluate and export read it as one);
    # otherwise they read the run's Task: its fields, its figures, its served outputs.
    exports_classifier = False

    @classmethod
    def from_train_config(cls, config) -> "Task":
        """The task as a TrainConfig asks for it (override to read recipe fields)."""
        return cls()

    @classmethod
    def for_run(cls, settings: Dict[str, Any]) -> "Task":
        """The task again from a finished run's config.json (`settings`), for evaluate, predict and
        export: by default made without arguments (a Task whose figures depend on its settings,
        depth's loss, reads them here)."""
        return cls()

    def build_model(self, plan) -> keras.Model:
        """The model this task trains, built for the run's plan (plan.model: the
        ViTConfig; plan.image_size, plan.num_classes, plan.num_channels); the
        trainer builds it under the strategy's scope."""
        raise NotImplementedError

    def encode(self, example: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        """One example as the model reads it, after its fields are decoded and augmented (and for
        padding examples too): by default as it is; an image-text Task turns its text into token ids
        here, in the input pipeline."""
        return example

    def compute_loss(self, model, batch, training: bool) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
        """(per-example loss (B,), {metric name: per-example value (B,)})."""
        raise NotImplementedError

    def weighted_sums(self, model, batch) -> Dict[str, tf.Tensor]:
        """One evaluation batch's sums: "loss" and each metric weighted by the examples'
        "weight" (0 for padding and unreadable files), and "count". The trainer's
        evaluation and `keras-vit evaluate` both sum these over the set, then `summarize`."""
        per_example_loss, metrics = self.compute_loss(model, batch, training=False)
        weight = tf.cast(batch["weight"], tf.float32)
        sums = {"loss": tf.reduce_sum(tf.cast(per_example_loss, tf.float32) * weight),
                "count": tf.reduce_sum(weight)}
        sums.update({k: tf.reduce_sum(tf.cast(v, tf.float32) * weight) for k, v in metrics.items()})
        return sums

    def summarize(self, sums: Dict[str, float]) -> Dict[str, float]:
        """An evaluation's figures from its sums over the whole set ("count": the
        examples, "loss" and each metric: weighted sums): by default each the
        mean over the examples. results.json reports these; evaluate prints them."""
        count = sums.get("count", 0.0)
        return {"num_examples": int(count), **{k: v / max(count, 1e-9) for k, v in sums.items() if k != "count"}}

    def feature_model(self, model):
        """A model from images to frozen features for the few-shot linear
        evaluation, or None if the task has none."""
        return None

    def export_model(self, model) -> keras.Model:
        """The model written to <workdir>/model.keras: a PatchGridModel's float32 copy with
        LoRA's updates merged (PatchGridModel.exported); any other model as it is."""
        from keras_vit.model.patch_grid import PatchGridModel

        return model.exported() if isinstance(model, PatchGridModel) else model

    def baseline_feature_model(self, model):
        """Features of the same architecture at this run's random
        initialisation, evaluated beside `feature_model` as a baseline
        (results.json "fewshot_random_init"), or None."""
        return None

    def serving_outputs(self, model, images) -> Dict[str, tf.Tensor]:
        """What an export of `model` (export_model's) serves for `images` as the
        model takes them: {output name: (B, ...) tensor}. A classifier's export
        has its own signatures (probabilities, top-k labels); a Task whose
        model is not a classifier names its outputs here."""
        outputs = model(images, training=False)
        return outputs if isinstance(outputs, dict) else {"outputs": outputs}

    def serve(self, model, pixels) -> Dict[str, tf.Tensor]:
        """`serving_outputs` of pixels 0..255 (B, H, W, C), scaled as the model's ViT takes them
        (keras_vit.images.pixel_normalization): what export, predict and quantize run."""
        x = images_lib.normalize(tf.cast(pixels, tf.float32), images_lib.pixel_normalization(model.vit))
        return self.serving_outputs(model, x)

    def describe_outputs(self, outputs: Dict[str, Any]) -> str:
        """One line of one image's served outputs (numpy), as `keras-vit predict` prints it:
        a map of class ids by the share of each class, any other output by its shape."""
        parts = []
        for key, value in outputs.items():
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.integer) and value.ndim == 2:
                ids, counts = np.unique(value, return_counts=True)
                ranked = sorted(zip(ids, counts), key=lambda pair: -pair[1])
                shares = ", ".join(f"{i}: {c / value.size:.0%}" for i, c in ranked)
                parts.append(f"{key} {value.shape[1]}x{value.shape[0]} ({shares})")
            else:
                parts.append(f"{key} {'x'.join(map(str, value.shape)) or 'scalar'}")
        return "; ".join(parts)

    def describe(self, figures: Dict[str, float]) -> str:
        """One line of an evaluation's figures, as `keras-vit evaluate` prints them."""
        return ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if k != "num_examples")
