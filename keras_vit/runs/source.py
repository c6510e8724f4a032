"""What a command means by MODEL: a run folder, a `.keras` file, or anything
`keras_vit.from_pretrained` takes.

    a run folder (model.keras, labels.txt, ...)     keras_vit.runs.load_model
    a .keras file                                    keras_vit.runs.load_model
    an HF transformers, keras-hub or timm folder     keras_vit.from_pretrained
    an official .npz, a model.safetensors            keras_vit.from_pretrained
    hf:ORG/NAME, timm:NAME, kerashub:PRESET,
    an official name ("imagenet21k:B/16")            keras_vit.from_pretrained

`keras-vit predict`, `inspect` and `export` open their model here, and pick
its class names by one rule (`choose_labels`). Run folders and `.keras` files
may be on any filesystem keras_vit.utils.storage reaches; checkpoints are local.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, List, Optional

from keras_vit import runs
from keras_vit.utils import storage

# For messages: every form `open_model` takes.
FORMS = ("a run folder, a .keras file, a checkpoint folder (HF transformers, keras-hub, timm), an official .npz, "
         "'hf:ORG/NAME', 'timm:NAME', 'kerashub:PRESET' or an official name such as 'imagenet21k:B/16'")


def no_head_error(command: str):
    """The UserError for a model without a classification head (a backbone checkpoint: DINOv2,
    CLIP's vision tower, a ViTModel) given to `command` ("predict", "export"), which classifies:
    it names the fix, fine-tuning on the user's classes, in the caller's language."""
    from keras_vit.utils import console as _console
    from keras_vit.errors import UserError

    fine_tune = _console.either("keras-vit train --weights MODEL --dataset folder:PATH --workdir RUN",
                                "keras_vit.training.train(TrainConfig.create('finetune', weights=MODEL, "
                                "dataset='folder:PATH', workdir=RUN))")
    return UserError(f"This model has no classification head (include_top=False): nothing to {command}. Fine-tune "
                     f"it on your classes first ({fine_tune}), then {command} the run.")


@dataclasses.dataclass
class ModelSource:
    model: Any
    labels: Optional[List[str]]  # None: none known (show class indices)
    name: str  # the file's, folder's or checkpoint's name
    description: str  # for messages: "workdir runs/demo", "checkpoint hf-dir", ...


def open_model(source, labels=None) -> ModelSource:
    """The model named by `source` (see the module docstring), with its class
    names: `labels` (a list or a file) if given, else `choose_labels`'.

    A name that is nothing of these raises runs.ModelFileError saying what
    would be taken; a checkpoint that cannot be read, from_pretrained's error.
    """
    path = os.fspath(source)
    if is_checkpoint(path) or _damaged_checkpoint(path):
        from keras_vit.model.pretrained import from_pretrained  # it names what is wrong with a damaged config.json

        model = from_pretrained(path)
        return ModelSource(model, choose_labels(model, labels), _name(path), f"checkpoint {path}")
    if not storage.exists(path):
        if not path.endswith(".keras"):  # runs names a missing .keras file itself
            raise runs.ModelFileError(f"{path!r} does not exist and names no checkpoint: give {FORMS}.")
    elif storage.isdir(path) and not runs.is_run_folder(path):
        raise runs.ModelFileError(
            f"Folder {path!r} is neither a run folder nor a checkpoint folder: it has no {runs.MODEL_FILE} (a "
            f"finished `keras-vit train` writes one) and no config.json of an HF transformers, keras-hub or timm "
            f"checkpoint.")
    model = runs.load_model(path)
    kind = "workdir" if storage.isdir(path) else "model file"
    return ModelSource(model, choose_labels(model, labels, path), _name(path), f"{kind} {path}")


def _damaged_checkpoint(path: str) -> bool:
    """A local folder with a config.json of no known kind, and no model.keras: a checkpoint whose config is damaged."""
    return (not storage.is_remote(path) and os.path.isfile(os.path.join(path, "config.json"))
            and not runs.is_run_folder(path))


def is_checkpoint(path: str) -> bool:
    """True when `path` is for from_pretrained: a checkpoint folder (not a run
    folder), a checkpoint file (.npz, .safetensors, a refused pickle) or a
    checkpoint name."""
    from keras_vit.weights import sources

    if storage.is_remote(path):
        return False  # from_pretrained reads local paths; remote run folders and .keras files go to runs
    if os.path.isdir(path):
        return not runs.is_run_folder(path) and sources.directory_kind(path) is not None
    if os.path.exists(path):
        return path.lower().endswith(sources.CHECKPOINT_SUFFIXES)
    return sources.is_checkpoint_name(path)


def choose_labels(model, override=None, path=None) -> Optional[List[str]]:
    """The class names for `model`: `override` (a list or a file), else the
    model's own (its config), else those kept in the run folder of `path`
    (models saved before labels were part of the config); None when none.
    Checked against the model's classes."""
    names = override if override is not None else getattr(model, "labels", None)
    if names is None and path is not None:
        names = runs.find_labels(path)
    if names is None:
        return None
    names = runs.read_labels(names)
    classes = num_classes(model)
    return names if classes is None else runs.check_labels(names, classes)


def num_classes(model) -> Optional[int]:
    """The classes of a classifier (a keras_vit.ViT or any one-output (batch,
    classes) Keras model); None for a model without a head."""
    if hasattr(model, "include_top"):
        return model.num_classes if model.include_top else None
    outputs = getattr(model, "outputs", None) or []
    if len(outputs) == 1 and len(outputs[0].shape) == 2:
        return int(outputs[0].shape[-1])
    return None


def _name(path: str) -> str:
    if storage.exists(path):
        base = storage.basename(storage.abspath(path))
        return base if storage.isdir(path) else os.path.splitext(base)[0]
    from keras_vit.weights.sources import NAME_PREFIXES

    if path.startswith(NAME_PREFIXES):  # the repository's or preset's own name
        return path.split(":", 1)[1].split("@")[0].rstrip("/").split("/")[-1]
    return path


def resized(opened: ModelSource, image_size=None, dynamic_image_size=False) -> ModelSource:
    """`opened` with its ViT rebuilt at `image_size` (position weights resized by
    the loader's rule) and/or taking any size (ViT.with_image_size); unchanged
    when neither is asked. The one rule behind predict, inspect and export's
    --image-size and --dynamic-image-size."""
    if image_size is None and not dynamic_image_size:
        return opened
    from keras_vit.errors import UserError
    from keras_vit.model import ViT

    if not isinstance(opened.model, ViT):
        raise UserError(f"--image-size and --dynamic-image-size rebuild a keras_vit ViT; {opened.model.name} is a "
                        f"{type(opened.model).__name__}: use it at its own size.")
    model = opened.model.with_image_size(image_size, dynamic_image_size=dynamic_image_size or None)
    return dataclasses.replace(opened, model=model)
