"""The tf.distribute trainer (installed as keras_vit.training).

    from keras_vit import training
    config = training.TrainConfig.create("scratch", model="Mu/4", patch_size=7, dataset="mnist5k", workdir="runs/demo")
    results = training.train(config)      # also: `keras-vit train ...`

Modules: config (Recipe, TrainConfig, the named recipes), data (input
pipelines), tasks (what is learned: model, loss, metrics), optimization
(schedules, optimizers), strategies (tf.distribute by name), loop (the
custom training loop), checkpointing (resumable checkpoints), evaluation
(few-shot linear evaluation), transfer (initial weights), cli.
"""

from keras_vit.backend_guard import require_tensorflow

require_tensorflow("keras_vit.training (the tf.distribute trainer)")

from keras_vit.training.checkpointing import IncompatibleCheckpointError
from keras_vit.training.config import FINETUNE, PRETRAIN, RECIPES, SCRATCH, Recipe, TrainConfig, demo_config
from keras_vit.training.evaluation import extract_features, few_shot_linear_eval, fit_least_squares
from keras_vit.training.loop import NonFiniteLossError, TrainingInterrupted, train
from keras_vit.training.tasks import TASKS, ClassificationTask, Task

__all__ = [
    "FINETUNE", "PRETRAIN", "RECIPES", "SCRATCH", "TASKS", "ClassificationTask", "IncompatibleCheckpointError",
    "NonFiniteLossError", "Recipe", "Task", "TrainConfig", "TrainingInterrupted", "demo_config",
    "extract_features", "few_shot_linear_eval", "fit_least_squares", "train",
]
