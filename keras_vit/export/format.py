"""What the exporter knows about one format, in one place: `ExportFormat`.

Each format's module (saved_model, tflite, tflite_int8, onnx_model, hf)
declares its `EXPORT_FORMATS`; keras_vit.export.registry collects them, and
the exporter, the command line, the defaults, the validation and the
missing-extra handling read them there. Adding a format is one module with
one declaration, named in registry.MODULES.

Declaring a format imports nothing heavy (its builder and checker import
their converters when called), so `keras-vit export --help` lists the
formats without starting TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

# Validation thresholds: max |diff| of probabilities, min top-1 agreement with
# Keras, max top-1 accuracy drop (fraction) where labels exist. None: not checked.
EXACT = {"max_abs_diff": 1e-4, "min_agreement": None, "max_accuracy_drop": None}


@dataclasses.dataclass
class Build:
    """What a format's builder gets: the model and everything around it."""

    model: Any
    labels: List[str]
    path: str  # where the artifact goes (a file or a folder), inside the staging folder
    scratch: str  # a folder the formats share for intermediate files (the TFLite converter's source)
    top_k: int
    calibration: Any = None  # data.Images for calibrated formats, else None
    calibration_reference: Any = None  # Keras probabilities on the calibration images
    thresholds: Mapping[str, Optional[float]] = dataclasses.field(default_factory=dict)
    attempt: int = 0  # 0, then 1, 2, ... when the exporter asks for the format's next candidate
    state: Dict[str, Any] = dataclasses.field(default_factory=dict)  # the format's own, between attempts
    max_num_patches: Optional[int] = None  # a NaFlex model's patch budget (serving_bytes); None: the table's


class NoOtherCandidate(Exception):
    """A format's builder has no further candidate to offer (Build.attempt > 0)."""


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One export format.

    name: what --formats takes ("tflite-fp16"; "-" and "_" are interchangeable).
    description: one line for --help and the docs.
    layout: the artifact's path under --out, from the artifact `name` and the
        SavedModel `version`: "{name}.fp16.tflite", "{name}/{version}".
    runtime: the runner (keras_vit/export/runner.py) that loads the artifact in
        a fresh process, as a deployment would.
    build: writes the artifact (Build) and returns notes for the report.
    check: refuses, before anything is built, a model the format cannot
        take (ValueError) or a missing package (keras_vit.errors.MissingExtra).
    thresholds: what the artifact must meet against Keras (see EXACT).
    default: built when no formats are named (else only when asked for).
    extra: the pip extra its packages come in; a default format whose extra
        is missing is skipped, with the install line in the report.
    calibrated: needs calibration images (int8).
    check_outputs: further checks on the runner's outputs, for what only
        this format returns: (outputs, class names) -> problems.
    agreement_retries: how many further candidates the exporter asks `build`
        for (Build.attempt 1, 2, ...) when an artifact misses only its top-1
        agreement (accuracy within budget, nothing else wrong); each is held
        to the same thresholds. 0: none.
    quantized_thresholds: what the artifact of a quantised model
        (keras_vit.quantize) must meet against that model; None: `thresholds`.
    refuses_quantized: why the format does not take a quantised model
        (skipped among the defaults, refused when named); "": it takes one.
    """

    name: str
    description: str
    layout: str
    runtime: str
    build: Callable[[Build], Dict]
    check: Callable[[Any], None]
    thresholds: Mapping[str, Optional[float]] = dataclasses.field(default_factory=lambda: dict(EXACT))
    default: bool = True
    extra: Optional[str] = None
    calibrated: bool = False
    check_outputs: Optional[Callable[[Mapping, List[str]], List[str]]] = None
    agreement_retries: int = 0
    quantized_thresholds: Optional[Mapping[str, Optional[float]]] = None
    refuses_quantized: str = ""

    def relative_path(self, name: str, version: int) -> str:
        """The artifact's path relative to --out."""
        return os.path.join(*self.layout.format(name=name, version=version).split("/"))

    def limits(self, overrides: Optional[Mapping] = None, quantized: bool = False) -> Dict[str, Optional[float]]:
        """The thresholds (a quantised model's, for one), with `overrides`
        (export(thresholds={name: {...}})) on top."""
        base = self.quantized_thresholds if quantized and self.quantized_thresholds is not None else self.thresholds
        return {**base, **((overrides or {}).get(self.name) or {})}
