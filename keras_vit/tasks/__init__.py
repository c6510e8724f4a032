"""Tasks: what is learned and what comes out: an example's fields, the model and
its heads, the loss, the metrics, what an evaluation reports and what an export
serves. The trainer, `keras-vit evaluate` and `keras-vit export` know only the
`Task` interface (base.py).

    fields           the kinds of an example's fields and how each moves with its image
    PatchGridModel   a ViT's patch tokens as a grid, read by a Task's own head (keras_vit.model.patch_grid)
    classification   ClassificationTask: softmax cross-entropy over the ViT's head
    masked_patch     MaskedPatchTask: self-supervised masked patch prediction
    image_text       ImageTextTask: SigLIP's and CLIP's contrastive losses on captions
    segmentation     SegmentationTask: a class per pixel (mIoU), under a linear or DPT head (dense.py)
    depth            DepthTask: metres per pixel (AbsRel, RMSE, delta1), the same heads

To add an objective, subclass Task (set `name` and `fields`, override
`build_model` to add its own head and `compute_loss` its own loss), and pass an
instance to `keras_vit.training.train(config, task=MyTask())`, name it on the
command line as `--task my_package.my_module:MyTask`, or add it to TASKS so
that `--task NAME` finds it.
"""

from __future__ import annotations

import importlib
import os
from typing import Optional

from keras_vit.errors import UserError
from keras_vit.tasks.base import ModelPlan, Task, across_replicas, build_task_model
from keras_vit.tasks.classification import ClassificationTask
from keras_vit.tasks.masked_patch import MaskedPatchTask
from keras_vit.tasks.image_text import ImageTextTask
from keras_vit.tasks.segmentation import SegmentationTask
from keras_vit.tasks.depth import DepthTask
from keras_vit.model.patch_grid import PatchGridModel  # the model of a Task with its own head
from keras_vit.tasks.metrics import top_k_hits

TASKS = {task.name: task for task in (ClassificationTask, MaskedPatchTask, ImageTextTask, SegmentationTask,
                                      DepthTask)}

# A recipe that trains something other than classification names its task
# here; an explicit --task other than the default "classification" wins.
RECIPE_TASKS = {"masked_patch": MaskedPatchTask.name, "siglip": ImageTextTask.name, "clip": ImageTextTask.name}


def make_task(config) -> Task:
    """The Task a TrainConfig asks for: config.task, or its recipe's task."""
    name = config.task
    if name == ClassificationTask.name:
        name = RECIPE_TASKS.get(config.recipe.name, name)
    _check_dense_options(config, name)
    return task_class(name).from_train_config(config)


def _check_dense_options(config, name: str) -> None:
    """--head, --freeze-backbone and --depth-loss belong to the per-pixel Tasks: given to one of
    ours that reads none of them, refused rather than ignored (a Task of your own may read them)."""
    from keras_vit.utils import console

    chosen = [f"{console.either(flag, field)} is for --task {' or '.join(readers)}" for flag, field, unset, readers in (
        ("--head", "head", "linear", (SegmentationTask.name, DepthTask.name)),
        ("--freeze-backbone", "freeze_backbone", False, (SegmentationTask.name, DepthTask.name)),
        ("--depth-loss", "depth_loss", "silog", (DepthTask.name,)))
        if getattr(config, field) != unset and name in TASKS and name not in readers]
    if chosen:
        raise UserError(f"{'; '.join(chosen)}, and this run's task is {name}: drop "
                        f"{'it' if len(chosen) == 1 else 'them'}, or give the task.")


def task_class(name: str):
    """The Task class of a name: one of TASKS, or "package.module:Class" (a Task of your own)."""
    if name in TASKS:
        return TASKS[name]
    if ":" not in name:
        raise UserError(f"Unknown task {name!r}: give one of {', '.join(sorted(TASKS))}, or a Task of your own "
                        f"as package.module:ClassName.")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UserError(f"The task {name!r} cannot be imported ({error}): put {module_name} on the Python path "
                        f"(PYTHONPATH), or fix the name.") from None
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Task)):
        raise UserError(f"{module_name} has no Task class {class_name!r}: name a subclass of "
                        f"keras_vit.tasks.Task as package.module:ClassName.")
    return found


def run_task(path) -> Optional[Task]:
    """The Task a run folder (or its model.keras) trained, where its model is not a classifier
    (Task.exports_classifier false): what `keras-vit evaluate`, `predict`, `quantize` and `export`
    read it by. None for a classifier's run, for anything that is not a run, and for a run whose
    Task cannot be imported here (a notebook's, a run before #54's names): read as a classifier."""
    from keras_vit import runs
    from keras_vit.runs.folder import CONFIG_FILE
    from keras_vit.utils import storage

    path = os.fspath(path)
    if not storage.exists(path):  # a name (hf:ORG/NAME, B/16): no run
        return None
    workdir = runs.workdir_of(path)
    if not runs.is_run_folder(workdir) or not storage.exists(storage.join(workdir, CONFIG_FILE)):
        return None
    settings = runs.read_config(workdir)
    name = (settings.get("plan") or {}).get("task", ClassificationTask.name)
    try:
        cls = task_class(name)
    except UserError:
        return None
    if cls.exports_classifier:
        return None
    try:
        return cls.for_run(settings)
    except TypeError as error:
        raise UserError(f"The run in {workdir} trained the Task {name}, which cannot be made without arguments "
                        f"({error}): give its constructor's arguments defaults, so that evaluate, predict and "
                        f"export can make it again.") from None


def task_name(task: Task) -> str:
    """What a run records of its Task, so that evaluate and export find it again: a name of
    TASKS, else its import path (package.module:Class)."""
    if TASKS.get(task.name) is type(task):
        return task.name
    return f"{type(task).__module__}:{type(task).__qualname__}"


__all__ = ["RECIPE_TASKS", "TASKS", "ClassificationTask", "DepthTask", "ImageTextTask", "MaskedPatchTask", "ModelPlan",
           "PatchGridModel", "SegmentationTask", "Task",
           "across_replicas", "build_task_model", "make_task", "run_task", "task_class", "task_name", "top_k_hits"]
