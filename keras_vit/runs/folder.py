"""The run folder (workdir): the one place that knows its layout, reads it and writes it.

    <workdir>/model.keras      the trained model (written at the end of a run)
    <workdir>/config.json      the settings of the latest session, plus what they resolved to
    <workdir>/labels.txt       one class name per line, index = class id
    <workdir>/results.json     the final figures and the history of the run's segments
    <workdir>/checkpoints/     resumable state (format: keras_vit.training.checkpointing)
    <workdir>/tensorboard/     TensorBoard logs

Train writes it; predict, inspect, export and `train --weights` read it. The
workdir may be on any filesystem keras_vit.utils.storage reaches (a local folder,
gs://, ram://); every file is written atomically. Nothing here imports Keras or
TensorFlow until a model is loaded or a remote path is used, so the command
line can describe itself without starting TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import zipfile
import zlib
from typing import List, Optional, Sequence, Union

from keras_vit.utils import storage
from keras_vit.errors import UserError
from keras_vit.utils.labels import check_labels, default_labels, labels_in_text  # noqa: F401 - keras_vit.runs.check_labels, as before

MODEL_FILE = "model.keras"
CONFIG_FILE = "config.json"
LABELS_FILE = "labels.txt"
RESULTS_FILE = "results.json"
CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"

# The members of a Keras 3 `.keras` archive (keras.src.saving.saving_lib): the
# config and metadata Keras reads first, and the weights in one of two formats.
_KERAS_CONFIG = "config.json"
_KERAS_METADATA = "metadata.json"
_KERAS_WEIGHTS = ("model.weights.h5", "model.weights.npz")

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
    ViT layers). A missing path, a folder without model.keras, a file that
    is not a whole `.keras` archive and a model of classes defined outside
    Keras and keras_vit each raise ModelFileError naming which. Any other
    failure to load is raised as it is (a bug: the command line shows it so).
    """
    file = model_path(path)
    with contextlib.ExitStack() as stack:
        try:
            local = stack.enter_context(storage.local_copy(file))  # Keras reads local files only
        except OSError as error:  # a remote file that cannot be copied
            raise ModelFileError(f"{file!r} cannot be read ({error.strerror or error}).") from error
        model = _load_local(file, local, compile)
    if include_preprocessing is not None:
        if not hasattr(model, "with_preprocessing"):
            raise UserError(f"{file!r} holds a {type(model).__name__}, not a keras_vit ViT: include_preprocessing "
                            f"applies to ViTs only.")
        model = model.with_preprocessing(include_preprocessing)
    return model


def _load_local(file: str, local: str, compile: bool):
    """Keras' model from the local copy `local` of `file` (the name in messages).

    What the user can fix is checked first, each with its own message: an
    archive that is not whole, and classes defined outside Keras and
    keras_vit. Past these checks a failure is Keras' or ours (a `from_config`
    that no longer takes what an older keras_vit saved), so it is not caught:
    the command line shows it as a bug, with its traceback."""
    config = _archive_config(file, local)
    import keras

    import keras_vit.layers  # noqa: F401 - registers the ViT layers for deserialisation
    import keras_vit.model  # noqa: F401

    foreign = _foreign_classes(config, keras)
    if foreign:
        raise ModelFileError(f"{file!r} holds {', '.join(foreign)}, defined outside Keras and keras_vit: load it with "
                             f"keras.saving.load_model after importing the code that defines "
                             f"{'them' if len(foreign) > 1 else 'it'}.")
    return keras.saving.load_model(local, compile=compile)


def _unreadable(file: str, why: str) -> ModelFileError:
    return ModelFileError(f"{file!r} exists but cannot be read as a .keras model{why}. Re-copy it, or re-run the "
                          f"training that wrote it.")


def _archive_config(file: str, local: str) -> dict:
    """The model config of the `.keras` archive `local`, once the archive is
    known to be whole: every member's checksum, the JSON Keras reads first,
    and a weights file (a truncated or corrupt copy fails one of these)."""
    if not zipfile.is_zipfile(local):
        raise _unreadable(file, ": it is not a zip archive (truncated or corrupt copy?)")
    try:
        with zipfile.ZipFile(local) as archive:
            damaged = archive.testzip()  # reads every member: Keras would stop half-way on the first bad one
            names = set(archive.namelist())
            texts = {name: archive.read(name) for name in (_KERAS_CONFIG, _KERAS_METADATA) if name in names}
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:  # what zipfile raises for damaged data
        raise _unreadable(file, f" ({type(error).__name__}: {_short(error)})") from error
    if damaged is not None:
        raise _unreadable(file, f" (its member {damaged} is damaged: bad checksum)")
    if _KERAS_CONFIG not in texts:
        raise _unreadable(file, f": the archive has no {_KERAS_CONFIG} (not a Keras 3 model file?)")
    if not names & set(_KERAS_WEIGHTS):
        raise _unreadable(file, f": the archive has no {' or '.join(_KERAS_WEIGHTS)}")
    parsed = {}
    for name, text in texts.items():
        try:
            parsed[name] = json.loads(text)
        except ValueError as error:  # json.JSONDecodeError, UnicodeDecodeError
            raise _unreadable(file, f" (its {name} is damaged: {type(error).__name__}: {_short(error)})") from error
    if not isinstance(parsed[_KERAS_CONFIG], dict):
        raise _unreadable(file, f" (its {_KERAS_CONFIG} holds no model config)")
    return parsed[_KERAS_CONFIG]


def _short(error: BaseException) -> str:
    reason = " ".join(str(error).split())
    return reason if len(reason) <= 300 else reason[:300] + "..."


# Keras imports these packages itself when a file names them (keras.saving.serialization_lib).
_KERAS_IMPORTS = ("keras", "keras_hub", "keras_cv", "keras_nlp")


def _foreign_classes(config: dict, keras) -> List[str]:
    """Registered names of the classes in a model config that neither Keras
    nor keras_vit defines and nothing has registered: a model built with
    someone's own layers, which keras_vit cannot rebuild. A class of Keras or
    keras_vit is never foreign: if it fails to load, that is a bug to show."""
    found = []
    for entry in _class_entries(config):
        module, name = entry.get("module"), entry.get("registered_name") or entry.get("class_name")
        if not isinstance(module, str) or not isinstance(name, str):
            continue  # Keras' own plain values (tuples, dtypes) name no module
        package = module.split(".")[0]
        if package == "keras_vit" or (package in _KERAS_IMPORTS and importlib.util.find_spec(package)):
            continue
        if keras.saving.get_registered_object(name) is None and name not in found:
            found.append(name)
    return found


def _class_entries(data):
    """Every serialised object (a dict with a "class_name") inside a Keras config."""
    if isinstance(data, dict):
        if "class_name" in data:
            yield data
        for value in data.values():
            yield from _class_entries(value)
    elif isinstance(data, list):
        for value in data:
            yield from _class_entries(value)


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
            data = json.loads(text)
        except ValueError as error:  # json.JSONDecodeError
            raise UserError(f"Labels file {path!r} is not a JSON list of class names ({error}).") from None
        return _names(data, f"Labels file {path!r}")
    return labels_in_text(text)


def _names(data, where: str) -> List[str]:
    """Class names from a list, {index: name}, or an object with one of _LABEL_KEYS;
    `where` ("Labels file 'x.json'") begins the UserError for anything else."""
    if isinstance(data, dict):
        for key in _LABEL_KEYS:
            if key in data:
                return _names(data[key], where)
        return [str(data[k]) for k in sorted(data, key=lambda k: _class_index(k, where))]
    if isinstance(data, list):
        return [str(name) for name in data]
    raise UserError(f"{where} is not a JSON list of class names (expected a list of names, got "
                    f"{type(data).__name__}).")


def _class_index(key: str, where: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise UserError(f"{where} is not a JSON list of class names ({key!r} is not a class index).") from None


def find_labels(path: PathLike) -> Optional[List[str]]:
    """The class names kept with a model: `labels.txt` of its workdir, else a
    labels list in its results.json; None when there are none."""
    workdir = workdir_of(path)
    if storage.isfile(storage.join(workdir, LABELS_FILE)):
        return read_labels(storage.join(workdir, LABELS_FILE))
    results = read_results(workdir)
    for key in _LABEL_KEYS:
        if isinstance(results.get(key), (list, dict)):
            return _names(results[key], f"{key!r} in {storage.join(workdir, RESULTS_FILE)!r}")
    return None


def write_labels(workdir: PathLike, labels: Optional[Sequence[str]], num_classes: int) -> str:
    """Writes `<workdir>/labels.txt`: `labels`, or "0".."N-1" when None."""
    labels = check_labels(default_labels(num_classes) if labels is None else labels, num_classes)
    path = storage.join(workdir, LABELS_FILE)
    storage.write_text(path, "".join(label + "\n" for label in labels))
    return path


# --- config and results -------------------------------------------------------------------------------------

def read_json(path: PathLike) -> dict:
    """A JSON object from `path`; {} when the file is missing or is not a JSON
    object. Any other failure to read it (permissions, a lost connection) is raised."""
    try:
        raw = storage.read_bytes(path)
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:  # not JSON (json.JSONDecodeError) or not text (UnicodeDecodeError)
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
