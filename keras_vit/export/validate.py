"""Validation of one artifact: loaded in a fresh process, compared with Keras."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Optional

import numpy as np

from keras_vit.utils import console as _console
from keras_vit.errors import CannotContinue
from keras_vit.export import report as report_lib
from keras_vit.export.registry import REGISTRY


class ArtifactFailed(CannotContinue):
    """The artifact did not load, run or answer in the shape Keras does, in a fresh process."""

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
PROBABILITIES = "probabilities"  # the runner's output, and the suffix of every other signature's


def runtime_of(fmt: str) -> str:
    """The runner that loads `fmt`'s artifacts (ExportFormat.runtime)."""
    return REGISTRY[fmt].runtime


def size_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def start_runner(command: List[str], env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Runs the runner's command line in a new process (its returncode and stderr are read).
    The test suite hands the SavedModel and HF runs to one long-lived runner process per
    worker instead (tests/conftest.py): importing TensorFlow or torch for every artifact was
    a tenth of its time."""
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def run_fresh(fmt: str, artifact: str, images_file: str, out_file: str, latency_runs: int,
              timeout: float = 1800) -> Dict[str, np.ndarray]:
    """Runs runner.py on the artifact in a new Python process; its outputs as arrays."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, RUNNER, runtime_of(fmt), artifact, images_file, out_file, str(latency_runs)]
    try:
        done = start_runner(command, env, timeout)
    except subprocess.TimeoutExpired:
        raise ArtifactFailed(f"loading and running the {fmt} artifact took over {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines()
                 if not (_console.STARTUP_CHATTER.search(line) or _console.CONVERSION_CHATTER.search(line))]
        tail = "\n".join(lines[-8:])
        raise ArtifactFailed(f"the {fmt} artifact failed in a fresh process (exit {done.returncode}):\n{tail}")
    with np.load(out_file) as outputs:
        return {k: outputs[k] for k in outputs.files}


def validate(fmt: str, artifact: str, images_file: str, reference: np.ndarray, labels: Optional[np.ndarray],
             class_names: List[str], scratch: str, latency_runs: int = 20,
             thresholds: Optional[Dict] = None) -> Dict:
    """A report row for `artifact`: size, max abs diff and top-1 agreement with
    `reference` (Keras probabilities), accuracy where `labels` exist, latency,
    and the thresholds it fails (`passed` False if any). Every signature the
    runner reports (`<prefix>probabilities`) is compared; the row holds the worst."""
    thresholds = REGISTRY[fmt].thresholds if thresholds is None else thresholds
    row = {"format": fmt, "size_bytes": size_bytes(artifact), "thresholds": thresholds}
    outputs = run_fresh(fmt, artifact, images_file, os.path.join(scratch, f"{fmt}-outputs.npz"), latency_runs)
    row.update(_compare(_probabilities(outputs, "", fmt, reference), reference, labels))
    row["latency_ms"] = float(outputs["latency_ms"])
    for prefix in _other_signatures(outputs):  # e.g. the SavedModel's encoded-bytes signature
        other = _compare(_probabilities(outputs, prefix, fmt, reference), reference, labels)
        row[f"{prefix}signature"] = other
        row["max_abs_diff"] = max(row["max_abs_diff"], other["max_abs_diff"])
        row["top1_agreement"] = min(row["top1_agreement"], other["top1_agreement"])
    check_outputs = REGISTRY[fmt].check_outputs
    problems = check_outputs(outputs, class_names) if check_outputs else []
    row["failures"] = problems + report_lib.failures(row, thresholds)
    row["passed"] = not row["failures"]
    return row


def _other_signatures(outputs) -> List[str]:
    """The output prefixes of the artifact's other signatures, as the runner lists them ("bytes_")."""
    return [str(prefix) for prefix in outputs.get("signatures", []) if prefix]


def _probabilities(outputs, prefix, fmt, reference):
    probs = outputs[prefix + PROBABILITIES]
    if probs.shape != reference.shape:
        raise ArtifactFailed(f"the {fmt} artifact returned shape {probs.shape}, Keras {reference.shape}")
    return probs


def _compare(probs, reference, labels) -> Dict:
    result = {
        "max_abs_diff": float(np.max(np.abs(probs.astype(np.float64) - reference))),
        "top1_agreement": float(np.mean(probs.argmax(1) == reference.argmax(1))),
        "accuracy": None,
        "accuracy_drop": None,
    }
    if labels is not None:
        result["accuracy"] = float(np.mean(probs.argmax(1) == labels))
        result["accuracy_drop"] = float(np.mean(reference.argmax(1) == labels)) - result["accuracy"]
    return result
