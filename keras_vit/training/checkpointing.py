"""Resumable checkpoints: model, optimizer, step and input position in one `.npz`.

<workdir>/checkpoints/ckpt-00001000.npz holds every model variable (weights,
dropout RNG state), every optimizer variable (moments, iteration count, loss
scale), and a JSON "meta" entry: the step, the number of training examples
consumed (the input position), and a fingerprint of everything that decides
the variables' meaning (architecture, resolution, classes, optimizer, task,
precision). A file is written to a temporary name and renamed, so a crash
never leaves a half checkpoint, and a write that fails (a full disk, an
unwritable workdir) is a CheckpointWriteError that leaves the previous
checkpoint in place; a workdir whose fingerprint differs is an error, never
overwritten. Where the folder is, is keras_vit.runs' business; it may be on
any filesystem keras_vit.utils.storage reaches (gs://, ram://).
"""

from __future__ import annotations

import json
import re
from typing import Optional, Tuple

import numpy as np

from keras_vit import runs
from keras_vit.utils import console as _console, storage
from keras_vit.errors import UserError

FORMAT = 1
_NAME = re.compile(r"ckpt-(\d+)\.npz$")


def _differences(prefix: str, saved: dict, wanted: dict) -> list:
    """"key: checkpoint A, this run B" for each differing key, nested dicts (the
    model's config) by their differing keys only, so the line shows the difference."""
    found = []
    for key in sorted(set(saved) | set(wanted)):
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(f"{prefix}{key}.", a, b)
        elif a != b:
            found.append(f"{prefix}{key}: checkpoint {a!r}, this run {b!r}")
    return found


class IncompatibleCheckpointError(UserError):
    """The workdir holds checkpoints of a different run."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, no permission); the previous one is intact."""


# Names Keras numbers per process (a Dropout's seed generator: seed_generator_12):
# matched by their kind and order, every other name by itself.
_AUTO_NUMBERED = re.compile(r"(^|/)(seed_generator)_\d+(?=/|$)")


def _describe(variables):
    return [[v.path, list(v.shape), str(np.dtype(v.dtype))] for v in variables]


def variable_keys(paths, kind):
    """The names a checkpoint matches variables by: the path (without the
    optimizer's own, auto-numbered name for optimizer variables), auto-numbered
    names by their kind, and "#n" on the n-th repeat of a name."""
    keys, seen = [], {}
    for path in paths:
        if kind == "optimizer" and "/" in path:
            path = path.split("/", 1)[1]
        path = _AUTO_NUMBERED.sub(r"\1\2", path)
        seen[path] = seen.get(path, 0) + 1
        keys.append(path if seen[path] == 1 else f"{path}#{seen[path]}")
    return keys


def _layout(entries, kind):
    """{key: (index, shape, dtype)} of [[path, shape, dtype], ...]."""
    keys = variable_keys([e[0] for e in entries], kind)
    return {key: (i, list(e[1]), e[2]) for i, (key, e) in enumerate(zip(keys, entries))}


def _layout_problems(kind, saved, current):
    """What differs between a checkpoint's variables and this run's, by name."""
    missing = sorted(set(current) - set(saved))
    extra = sorted(set(saved) - set(current))
    differ = sorted(k for k in set(saved) & set(current) if saved[k][1:] != current[k][1:])
    problems = []
    for what, keys in (("not in the checkpoint", missing), ("in the checkpoint only", extra)):
        if keys:
            problems.append(f"{kind} variables {what}: {', '.join(keys[:5])}" + (" ..." if len(keys) > 5 else ""))
    for key in differ[:5]:
        problems.append(f"{kind} variable {key}: checkpoint {saved[key][1]} {saved[key][2]}, this run "
                        f"{current[key][1]} {current[key][2]}")
    return problems


class CheckpointManager:
    """Saves to and restores from `<workdir>/checkpoints`.

    Args:
        workdir: the run's directory.
        fingerprint: JSON-able dict that must match for a resume.
        write: whether this process writes (the chief does; every worker reads).
        keep: how many recent checkpoints to keep.
    """

    def __init__(self, workdir: str, fingerprint: dict, write: bool = True, keep: int = 2):
        self.directory = runs.checkpoints_dir(workdir)
        self.fingerprint = json.loads(json.dumps(fingerprint))
        self.write = write
        self.keep = keep

    def steps(self):
        found = []
        for path in storage.glob(storage.join(self.directory, "ckpt-*.npz")):
            match = _NAME.search(storage.basename(path))
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def path(self, step: int) -> str:
        return storage.join(self.directory, f"ckpt-{step:08d}.npz")

    def latest(self) -> Optional[str]:
        steps = self.steps()
        return self.path(steps[-1]) if steps else None

    def save(self, step: int, examples_seen: int, model, optimizer) -> Optional[str]:
        if not self.write:
            return None
        meta = {
            "format": FORMAT, "step": int(step), "examples_seen": int(examples_seen),
            "fingerprint": self.fingerprint,
            "model_variables": _describe(model.variables),
            "optimizer_variables": _describe(optimizer.variables),
        }
        arrays = {"meta": np.array(json.dumps(meta))}
        for i, v in enumerate(model.variables):
            arrays[f"model/{i:05d}"] = np.asarray(v.numpy())
        for i, v in enumerate(optimizer.variables):
            arrays[f"optimizer/{i:05d}"] = np.asarray(v.numpy())
        try:
            storage.makedirs(self.directory)
            # A temporary name, renamed into place once complete.
            storage.write_bytes(self.path(step), lambda f: np.savez(f, **arrays))
        except OSError as error:  # storage raises remote failures as OSErrors too
            previous = [s for s in self.steps() if s != step]
            kept = (f"the previous checkpoint ({storage.basename(self.path(previous[-1]))}) is intact"
                    if previous else "no earlier checkpoint exists")
            raise CheckpointWriteError(
                f"Cannot write the checkpoint of step {step} to {self.directory} "
                f"({error.strerror or error}); {kept}. Free disk space or make the workdir writable, then re-run "
                f"the same command to resume.") from error
        for old in self.steps()[:-self.keep]:
            storage.remove(self.path(old))
        return self.path(step)

    def read(self, path: str) -> Tuple[dict, dict]:
        try:
            # A seekable file, read member by member: no second copy of a large checkpoint in memory.
            with storage.open(path, "rb") as f, np.load(f, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            meta = json.loads(str(arrays.pop("meta")))
        except Exception as error:  # noqa: BLE001 - any unreadable file gets the same advice
            raise IncompatibleCheckpointError(
                f"Cannot read checkpoint {path} ({type(error).__name__}: {error}). Delete it to resume "
                f"from an earlier one, or use a new {_console.either('--workdir', 'workdir')}.") from error
        return meta, arrays

    def check(self, meta: dict, model, optimizer, path: str) -> None:
        problems = []
        if meta.get("format") != FORMAT:
            problems.append(f"checkpoint format {meta.get('format')} (this trainer writes {FORMAT})")
        saved = _with_config_defaults(meta.get("fingerprint", {}))
        problems += _differences("", saved, self.fingerprint)
        if not problems:
            for kind, variables in (("model", model.variables), ("optimizer", optimizer.variables)):
                # By name, shape and dtype: q, k and v kernels share a shape, never a name.
                problems += _layout_problems(kind, _layout(meta[f"{kind}_variables"], kind),
                                             _layout(_describe(variables), kind))
        if problems:
            raise IncompatibleCheckpointError(
                f"The workdir {storage.dirname(self.directory)!r} holds a checkpoint ({storage.basename(path)}) "
                f"of a different run, so it cannot be resumed and will not be overwritten:\n  - "
                + "\n  - ".join(problems)
                + "\nRe-run with the settings it was made with, or choose a new "
                + f"{_console.either('--workdir', 'workdir')}.")

    def restore(self, model, optimizer) -> Optional[Tuple[int, int]]:
        """Loads the latest checkpoint; returns (step, examples_seen), or None
        when there is none. Raises IncompatibleCheckpointError on a mismatch."""
        path = self.latest()
        if path is None:
            return None
        meta, arrays = self.read(path)
        self.check(meta, model, optimizer, path)
        for kind, variables in (("model", model.variables), ("optimizer", optimizer.variables)):
            saved = _layout(meta[f"{kind}_variables"], kind)
            for key, v in zip(variable_keys([v.path for v in variables], kind), variables):
                v.assign(arrays[f"{kind}/{saved[key][0]:05d}"])
        return meta["step"], meta["examples_seen"]


def _with_config_defaults(fingerprint: dict) -> dict:
    """A saved fingerprint with the ViTConfig fields added since it was written
    (e.g. position_embedding) set to their defaults, so that a run checkpointed
    before a field existed still resumes: it was trained with the default."""
    model = fingerprint.get("model")
    if not isinstance(model, dict):
        return fingerprint
    from keras_vit.config import ViTConfig

    try:
        return {**fingerprint, "model": json.loads(json.dumps(ViTConfig.from_dict(model).to_dict()))}
    except (TypeError, ValueError):  # not a config this version reads: compared as it is
        return fingerprint
