"""Tasks: what is learned (the model, its loss and metrics). The training loop
knows only the `Task` interface (base.py).

    classification   ClassificationTask: softmax cross-entropy over the ViT's head
    masked_patch     MaskedPatchTask: self-supervised masked patch prediction

To add an objective, subclass Task, override `build_model` (to add its own
head) and `compute_loss` (its own loss), and either pass an instance to
`keras_vit.training.train(config, task=MyTask())` or add it to TASKS so that
`--task NAME` finds it.
"""

from __future__ import annotations

from keras_vit.errors import UserError
from keras_vit.training.tasks.base import Task
from keras_vit.training.tasks.classification import ClassificationTask
from keras_vit.training.tasks.masked_patch import MaskedPatchTask
from keras_vit.training.tasks.metrics import top_k_hits

TASKS = {task.name: task for task in (ClassificationTask, MaskedPatchTask)}

# A recipe that trains something other than classification names its task
# here; an explicit --task other than the default "classification" wins.
RECIPE_TASKS = {"masked_patch": MaskedPatchTask.name}


def make_task(config) -> Task:
    """The Task a TrainConfig asks for: config.task, or its recipe's task."""
    name = config.task
    if name == ClassificationTask.name:
        name = RECIPE_TASKS.get(config.recipe.name, name)
    if name not in TASKS:
        raise UserError(f"Unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}.")
    return TASKS[name].from_train_config(config)


__all__ = ["RECIPE_TASKS", "TASKS", "ClassificationTask", "MaskedPatchTask", "Task", "make_task", "top_k_hits"]
