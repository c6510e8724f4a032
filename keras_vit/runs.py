"""The run folder (workdir): the one place that knows its layout, reads it and writes it.

    <workdir>/model.keras      the trained model (written at the end of a run)
    <workdir>/config.json      the settings of the latest session, plus what they resolved to
    <workdir>/labels.txt       one class name per line, index = class id
    <workdir>/results.json     the final figures and the history of the run's segments
    <workdir>/checkpoints/     resumable state (format: keras_vit.training.checkpointing)
    <workdir>/tensorboard/     TensorBoard logs

Train writes it; predict, inspect, export and `train --weights` read it. The
workdir may be on any filesystem keras_vit.storage reaches (a local folder,
gs://, ram://); every file is written atomically. Nothing here imports Keras or
TensorFlow until a model is loaded or a remote path is used, so the command
line can describe itself without starting TensorFlow.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import List, Optional, Sequence, Union

from keras_vit import storage
from keras_vit.errors import UserError
from keras_vit.labels import check_labels, default_labels  # noqa: F401 - runs.check_labels, as before

MODEL_FILE = "model.keras"
CONFIG_FILE = "config.json"
LABELS_FILE = "labels.txt"
RESULTS_FILE = "results.json"
CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"

# Keys of results.json (or of a labels .json file) that may hold class names,
# in the order tried: "labels" is what this package writes.
_LABEL_KEYS = ("labels", "class_names", "classes", "label_names")

PathLike = Union[str, os.PathLike]


class ModelFileError(UserError):
    """A model path that does not exist, or a file that is not a readable `.keras` model."""


def model_path(path: PathLike) -> str:
    """The `.keras` file meant by `path`: the file itself, or `<workdir>/model.keras`."""
    path = os.fspath(path)
    if storage.isdir(path):
        inner = storage.join(path, MODEL_FILE)
        if not storage.isfile(inner):
            raise ModelFileError(f"Workdir {path!r} has no {MODEL_FILE} (has the training finished? Re-run "
                                 f"`keras-vit train` with the same --workdir to finish it).")
        return inner
    if not storage.exists(path):
        raise ModelFileError(f"Model file {path!r} does not exist: give a .keras file or a training workdir "
                             f"holding {MODEL_FILE}.")
    return path


def is_run_folder(path: PathLike) -> bool:
    """True for a folder training wrote (or is writing): its model, results or checkpoints are there."""
    path = os.fspath(path)
    return storage.isdir(path) and any(storage.exists(storage.join(path, name))
                                       for name in (MODEL_FILE, RESULTS_FILE, CHECKPOINTS_DIR))


def workdir_of(path: PathLike) -> str:
    """The run folder of a model path: the folder itself, or the folder holding the file."""
    path = os.fspath(path)
    return path if storage.isdir(path) else storage.dirname(storage.abspath(path))


def load_model(path: PathLike, compile: bool = False, include_preprocessing: Optional[bool] = None):
    """Loads a keras_vit model from a `.keras` file or a training workdir.

    What it takes: a model trained by `keras-vit train` (as every ViT built
    without include_preprocessing=True) takes images in [-1, 1], NOT pixels:

        model = keras_vit.load_model("runs/demo")
        model.input_range                                  # "[-1, 1]"
        logits = model(keras_vit.preprocess_input(pixels))  # pixels 0..255 -> [-1, 1]

    Fed pixels 0..255 directly it would answer wrongly; a keras_vit ViT
    called eagerly on such values (all >= 0, above 2) raises a ValueError
    saying so instead. `model.summary()` and `model.describe()` print what it
    takes. include_preprocessing=True returns the model taking pixels 0..255
    (the same weights, the scaling inside, as every exported artifact takes
    them: `model(pixels)`); False one taking [-1, 1]; None (the default) the
    model as saved.

    Works without a prior `import keras_vit` (this function registers the
    ViT layers). A missing path, a folder without model.keras and a file that
    is not a readable `.keras` model each raise ModelFileError naming which.
    """
    file = model_path(path)
    try:
        with storage.local_copy(file) as local:  # Keras reads local files only
            model = _load_local(file, local, compile)
    except OSError as error:  # a remote file that cannot be copied
        raise ModelFileError(f"{file!r} cannot be read ({error.strerror or error}).") from error
    if include_preprocessing is not None:
        if not hasattr(model, "with_preprocessing"):
            raise UserError(f"{file!r} holds a {type(model).__name__}, not a keras_vit ViT: include_preprocessing "
                            f"applies to ViTs only.")
        model = model.with_preprocessing(include_preprocessing)
    return model


def _load_local(file: str, local: str, compile: bool):
    """Keras' model from the local copy `local` of `file` (the name in messages)."""
    if not zipfile.is_zipfile(local):
        raise ModelFileError(f"{file!r} exists but cannot be read as a .keras model: it is not a zip archive "
                             f"(truncated or corrupt copy?). Re-copy it, or re-run the training that wrote it.")
    import keras

    import keras_vit.layers  # noqa: F401 - registers the ViT layers for deserialisation
    import keras_vit.model  # noqa: F401

    try:
        return keras.saving.load_model(local, compile=compile)
    except Exception as error:  # noqa: BLE001 - Keras raises many kinds for a damaged archive
        reason = " ".join(str(error).split())
        if len(reason) > 300:
            reason = reason[:300] + "..."
        raise ModelFileError(f"{file!r} exists but cannot be read as a .keras model ({type(error).__name__}: "
                             f"{reason}). Re-copy it, or re-run the training that wrote it.") from error


# --- labels -------------------------------------------------------------------------------------------------

def read_labels(source: Union[PathLike, Sequence[str]]) -> List[str]:
    """Class names from a list, a text file (one per line, index = class id) or a
    JSON file (a list, {index: name}, or an object with a "labels" list)."""
    if not isinstance(source, (str, os.PathLike)):
        return [str(name) for name in source]
    path = os.fspath(source)
    if not storage.isfile(path):
        raise FileNotFoundError(f"Labels file {path!r} does not exist.")
    text = storage.read_text(path)
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            return _names(json.loads(text))
        except (ValueError, TypeError, KeyError) as error:
            raise UserError(f"Labels file {path!r} is not a JSON list of class names "
                            f"({error}).") from None
    names = [line.rstrip("\r") for line in text.split("\n")]
    while names and not names[-1].strip():  # a trailing newline is not a class
        names.pop()
    return names


def _names(data) -> List[str]:
    if isinstance(data, dict):
        for key in _LABEL_KEYS:
            if key in data:
                return _names(data[key])
        return [str(data[k]) for k in sorted(data, key=int)]
    if isinstance(data, list):
        return [str(name) for name in data]
    raise TypeError(f"expected a list of names, got {type(data).__name__}")


def find_labels(path: PathLike) -> Optional[List[str]]:
    """The class names kept with a model: `labels.txt` of its workdir, else a
    labels list in its results.json; None when there are none."""
    workdir = workdir_of(path)
    if storage.isfile(storage.join(workdir, LABELS_FILE)):
        return read_labels(storage.join(workdir, LABELS_FILE))
    results = read_results(workdir)
    for key in _LABEL_KEYS:
        if isinstance(results.get(key), (list, dict)):
            return _names(results[key])
    return None


def write_labels(workdir: PathLike, labels: Optional[Sequence[str]], num_classes: int) -> str:
    """Writes `<workdir>/labels.txt`: `labels`, or "0".."N-1" when None."""
    labels = check_labels(default_labels(num_classes) if labels is None else labels, num_classes)
    path = storage.join(workdir, LABELS_FILE)
    storage.write_text(path, "".join(label + "\n" for label in labels))
    return path


# --- config and results -------------------------------------------------------------------------------------

def read_json(path: PathLike) -> dict:
    """A JSON object from `path`; {} when the file is missing or unreadable."""
    try:
        data = json.loads(storage.read_text(path))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_config(workdir: PathLike) -> dict:
    return read_json(storage.join(workdir, CONFIG_FILE))


def write_config(workdir: PathLike, config: dict) -> None:
    storage.write_text(storage.join(workdir, CONFIG_FILE), json.dumps(config, indent=2, default=str))


def read_results(workdir: PathLike) -> dict:
    return read_json(storage.join(workdir, RESULTS_FILE))


def write_results(workdir: PathLike, results: dict) -> None:
    storage.write_text(storage.join(workdir, RESULTS_FILE), json.dumps(results, indent=2, default=str))


def is_finished(workdir: PathLike, steps: int) -> bool:
    """Whether the run in `workdir` has ended at `steps` or later: its model and final results exist."""
    results = read_results(workdir)
    return (storage.isfile(storage.join(workdir, MODEL_FILE)) and results.get("status") == "finished"
            and int(results.get("steps", -1)) >= steps)


def changed_settings(previous: dict, current: dict) -> dict:
    """{setting: [before, after]} for the settings (flattened "recipe.x") that differ."""
    def flat(d, prefix=""):
        out = {}
        for key, value in d.items():
            if isinstance(value, dict) and key in ("recipe",):
                out.update(flat(value, f"{key}."))
            else:
                out[prefix + key] = value
        return out

    before, after = flat(_settings(previous)), flat(_settings(current))
    return {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)}


def _settings(config: dict) -> dict:
    # What the user chose; "progress" only changes what is printed, and the
    # resolved settings and the plan follow from the rest.
    return {k: v for k, v in json.loads(json.dumps(config, default=str)).items()
            if k not in ("resolved", "plan", "progress")}


def segments(workdir: PathLike) -> list:
    """The segments (one per training session) recorded so far in results.json."""
    found = read_results(workdir).get("segments")
    return list(found) if isinstance(found, list) else []


# --- writing ------------------------------------------------------------------------------------------------

def save_model(workdir: PathLike, model) -> str:
    """Writes `model` as `<workdir>/model.keras` (atomically: a failed save
    leaves the previous model); returns its path.

    A classifier takes the run's class names (`labels.txt`, written for the
    dataset at the start of the run) into its config first, so that the file
    keeps them wherever it is copied; they replace any names of a checkpoint
    it was fine-tuned from, since its head now answers this dataset's classes.
    """
    labels_file = storage.join(workdir, LABELS_FILE)
    if hasattr(model, "labels") and storage.isfile(labels_file):
        names = read_labels(labels_file)
        if len(names) == getattr(model, "num_classes", None):
            model.labels = names
    return storage.save_keras_model(model, storage.join(workdir, MODEL_FILE))


def checkpoints_dir(workdir: PathLike) -> str:
    return storage.join(workdir, CHECKPOINTS_DIR)


def tensorboard_dir(workdir: PathLike) -> str:
    return storage.join(workdir, TENSORBOARD_DIR)
