"""The Tasks' old address: they live in keras_vit.tasks (one folder a Task's fields, model, loss,
metrics and outputs), below training, so that export and evaluate read them too."""

from keras_vit.tasks import (  # noqa: F401
    RECIPE_TASKS, TASKS, ClassificationTask, MaskedPatchTask, Task, make_task, top_k_hits)

__all__ = ["RECIPE_TASKS", "TASKS", "ClassificationTask", "MaskedPatchTask", "Task", "make_task", "top_k_hits"]
