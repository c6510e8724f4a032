"""The tf.distribute trainer (installed as keras_vit.training).

    from keras_vit import training
    config = training.TrainConfig.create("scratch", model="Mu/4", patch_size=7, dataset="mnist5k", workdir="runs/demo")
    results = training.train(config)      # also: `keras-vit train ...`

Modules: config (Recipe, TrainConfig, the named recipes), plan (a run
resolved once: batches, steps, warmup, augmentation ops; everything after
reads it), sources (datasets by name or object), stream (epochs, shuffling,
sharding, resume position), augment (the training ops), data (the training,
evaluation and few-shot datasets), tasks (what is learned: model, loss,
metrics), optimization (schedules, optimizers), strategies (tf.distribute by
name), trainer (the Trainer: a run's set-up, loop, evaluation and end), steps
(the compiled device loop: one all-reduce per step), reporting (progress,
TensorBoard), checkpointing (resumable checkpoints), evaluation (few-shot
linear evaluation), transfer (initial weights), cli.
"""

import os as _os
import sys as _sys

from keras_vit.utils.lazy import lazy_exports


def _require_tensorflow():
    from keras_vit.utils.backend_guard import require_tensorflow

    require_tensorflow("keras_vit.training (the tf.distribute trainer)")


# Refuse at import time when another backend is chosen (checked without
# importing Keras unless it already is); else on first use.
if "keras" in _sys.modules or _os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    _require_tensorflow()

# Imported on first use (PEP 562): `keras-vit train --help` reads only the
# config module, without TensorFlow.
__getattr__, __dir__ = lazy_exports(__name__, {
    "IncompatibleCheckpointError": "keras_vit.training.checkpointing",
    "CheckpointWriteError": "keras_vit.training.checkpointing",
    **{name: "keras_vit.training.config" for name in (
        "FINETUNE", "PRETRAIN", "RECIPES", "SCRATCH", "Recipe", "TrainConfig", "demo_config")},
    **{name: "keras_vit.training.evaluation" for name in (
        "extract_features", "few_shot_linear_eval", "fit_least_squares")},
    **{name: "keras_vit.training.trainer" for name in (
        "NonFiniteLossError", "Trainer", "TrainingInterrupted", "train")},
    **{name: "keras_vit.tasks" for name in ("TASKS", "ClassificationTask", "Task")},
    "load_adapter": "keras_vit.training.transfer",
}, before=_require_tensorflow)

__all__ = [
    "FINETUNE", "PRETRAIN", "RECIPES", "SCRATCH", "TASKS", "CheckpointWriteError", "ClassificationTask",
    "IncompatibleCheckpointError", "NonFiniteLossError", "Recipe", "Task", "TrainConfig", "Trainer",
    "TrainingInterrupted",
    "demo_config", "extract_features", "few_shot_linear_eval", "fit_least_squares", "load_adapter", "train",
]
