"""`export()`: model -> artifacts, each validated in a fresh process, installed only when good.

Layout of `out` (TF Serving reads `<out>/<name>/`, serving its highest version);
each format's path is its ExportFormat.layout (keras_vit.export.registry):

    <out>/<name>/<version>/          SavedModel (serving_default, serving_bytes, assets/labels.txt)
    <out>/<name>.tflite              float32
    <out>/<name>.fp16.tflite         float16 weights
    <out>/<name>.dynamic-int8.tflite dynamic-range int8
    <out>/<name>.int8.tflite         int8 weights and activations, calibrated
    <out>/<name>.onnx                ONNX (tf2onnx)
    <out>/<name>-hf/                 HF transformers ViT directory (only when asked for: --formats hf)
    <out>/labels.txt                 one class name per line, index = class id
    <out>/report.json                the validation report

`out` holds one export, replaced as a whole (keras_vit.export.install): a
folder holding an export is replaced only when asked (overwrite,
`--overwrite`), and only by an export whose artifacts all passed: a failed
one leaves the previous export as it was. A folder holding anything else is
never written into. Into a new or empty folder, the artifacts that passed
are installed with the report saying which failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np

from keras_vit.utils import console as _console, storage
from keras_vit.errors import CannotContinue, MissingExtra, UserError
from keras_vit.export import install as install_lib
from keras_vit.export.format import Build, ExportFormat, NoOtherCandidate
from keras_vit.export.install import LABELS_FILE, REPORT_FILE
from keras_vit.export.registry import FORMATS, OPTIONAL_FORMATS, REGISTRY, ExportError, parse_formats

__all__ = ["FORMATS", "OPTIONAL_FORMATS", "ExportError", "ExportFailed", "Exporter", "export", "parse_formats",
           "LABELS_FILE", "REPORT_FILE"]

# What the user can fix, raised where it is checked: a UserError (a bad value,
# name, file or data), or a path that does not exist. Any other error while
# resolving the source or loading the data is a bug, and is not disguised as
# bad input: the command line shows its traceback.
_BAD_INPUT = (UserError, FileNotFoundError)


def _raised_by_keras_vit(error) -> bool:
    """True when `error` is no known kind and was raised in keras_vit's own code (its innermost
    frame): a converter or runtime failing inside TensorFlow, LiteRT or tf2onnx is not."""
    if isinstance(error, (UserError, CannotContinue)):
        return False
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return trace is not None and os.path.abspath(trace.tb_frame.f_code.co_filename).startswith(package + os.sep)


def _formats_that_work(model, refused: str) -> str:
    """' These formats take it: ...', naming the formats whose checks pass here, so that a refusal
    names the way on (a distilled DeiT has no hf form, but saved_model and tflite take it)."""
    from keras_vit.model.quantization import quantization_of

    working, quantized = [], quantization_of(model)
    for name, fmt in REGISTRY.items():
        try:
            if name != refused and not (quantized and fmt.refuses_quantized):
                fmt.check(model)
                working.append(name)
        except UserError:  # MissingExtra too: not here
            pass
    if not working:
        return ""
    return f" These formats take it: {_console.argument('formats', working)}."


class ExportFailed(CannotContinue):
    """Some artifact failed conversion or validation; `.report` says which and why."""

    def __init__(self, report):
        failed = [a["format"] for a in report["artifacts"] if not a["passed"]]
        kept = (f"the export already in {report['out']} is as it was, nothing of this one was installed"
                if report["report_path"] is None else f"the artifacts that passed are installed; see "
                f"{report['report_path']}")
        super().__init__(f"export failed for {', '.join(failed)} ({kept})")
        self.report = report


def export(model_or_path, formats=None, out="exports", *, validation_data=None, calibration_data=None,
           labels=None, name=None, version: Optional[int] = None, top_k: int = 5,
           num_validation: Optional[int] = None, num_calibration: int = 200, latency_runs: int = 20,
           thresholds: Optional[Dict[str, Dict]] = None, weights=None, image_size=None, num_classes=None,
           num_channels=None, overwrite: bool = False, raise_on_failure: bool = True,
           verbose: bool = True, dynamic_image_size: bool = False, max_num_patches: Optional[int] = None) -> Dict:
    """Exports a model to `formats` under `out`, validating every artifact.

    Args:
        model_or_path: a keras.Model, a `.keras` file, a training workdir
            (`model.keras`, optional `labels.txt` / `results.json` labels),
            anything keras_vit.from_pretrained takes (an HF transformers or
            keras-hub folder, "hf:ORG/NAME", ...), or a variant name with
            `weights`, `image_size`, `num_classes`, `num_channels`. The file
            or workdir may be on any filesystem keras_vit.utils.storage reaches.
        formats: a list or comma-separated string out of FORMATS +
            OPTIONAL_FORMATS. None: FORMATS, less those whose packages are
            not installed (each skipped one is said, and listed in the
            report's "skipped" with the pip command that adds it). A format
            named whose packages are missing raises MissingExtra.
        out: the output folder (created if needed), holding this export
            only. A local folder: the artifacts are built and validated in
            fresh processes beside it, then installed as one unit (copy them
            to object storage afterwards).
        validation_data: images to validate on: "mnist" (the bundled
            digits), an .npz/.npy path, a folder of images, an array of
            pixels 0..255, or (images, labels). Labels give accuracy.
            None: 32 random images (agreement only; not allowed for int8).
        calibration_data: the representative sample for tflite-int8, same
            forms (at most `num_calibration`, drawn across classes); default:
            `num_calibration` of the validation images drawn across classes
            and kept out of validation (when there are at least twice as many).
        labels: class names (list or file); default the model's own (its
            config), else the workdir's, else "0".."N-1".
        name: artifact name (default from the model file or workdir).
        version: SavedModel version; default 1, or one above the highest in
            the export replaced (so that TF Serving loads the new one).
        top_k: how many top classes the SavedModel signatures return.
        num_validation: use at most this many validation images (a seeded
            sample across classes).
        latency_runs: single-image calls timed per artifact.
        thresholds: per-format overrides of each format's thresholds.
        overwrite: replace the export already in `out` (as a whole, once the
            new one passed); without it such a folder is refused.
        dynamic_image_size: the SavedModel, ONNX and TFLite artifacts take
            any height and width (a keras_vit ViT rebuilt with
            dynamic_image_size=True); validated at the model's image_size.
        max_num_patches: a NaFlex (SigLIP2) model's patch budget: serving_bytes reads
            each image at its own aspect ratio within it (transformers'
            Siglip2ImageProcessor(max_num_patches=...)); None: the position
            table's. The artifacts are validated at the model's image_size
            brought within it, and the report records it (model.max_num_patches).
        raise_on_failure: raise ExportFailed (after installing what may be
            installed, see above) if any artifact failed.

    Returns:
        The report (also written to `<out>/report.json`).
    """
    task = _run_task(model_or_path)
    if task is not None:  # a run of a Task whose model is not a classifier: its own outputs
        from keras_vit.export.task_export import export_task_run

        return export_task_run(model_or_path, task, formats, out, validation_data=validation_data, name=name,
                               version=version, overwrite=overwrite, verbose=verbose,
                               dynamic_image_size=dynamic_image_size)
    exporter = Exporter(formats, out, validation_data=validation_data, calibration_data=calibration_data,
                        version=version, top_k=top_k, num_validation=num_validation,
                        num_calibration=num_calibration, latency_runs=latency_runs, thresholds=thresholds,
                        overwrite=overwrite, verbose=verbose, max_num_patches=max_num_patches)
    report = exporter.run(model_or_path, labels=labels, name=name, weights=weights, image_size=image_size,
                          num_classes=num_classes, num_channels=num_channels,
                          dynamic_image_size=dynamic_image_size)
    if raise_on_failure and not report["passed"]:
        raise ExportFailed(report)
    return report


@dataclasses.dataclass
class _Data:
    """The images an export is checked on, and Keras' answers on them."""

    validation: Any
    calibration: Any = None
    held_out: Optional[bool] = None  # whether calibration images were kept out of validation
    reference: Any = None  # Keras probabilities on the validation images
    calibration_reference: Any = None


class Exporter:
    """One export: choose the formats, load the data, build and validate each
    format in a staging folder, then install (see `export`, which builds one)."""

    def __init__(self, formats=None, out="exports", *, validation_data=None, calibration_data=None,
                 version=None, top_k=5, num_validation=None, num_calibration=200, latency_runs=20,
                 thresholds=None, overwrite=False, verbose=True, max_num_patches=None):
        self.by_default = formats is None
        self.names = list(FORMATS) if self.by_default else parse_formats(formats)
        self.out = os.fspath(out)
        self.validation_data, self.calibration_data = validation_data, calibration_data
        self.version, self.top_k = version, top_k
        self.num_validation, self.num_calibration = num_validation, num_calibration
        self.latency_runs, self.thresholds = latency_runs, thresholds
        self.overwrite, self.verbose = overwrite, verbose
        self.max_num_patches = max_num_patches
        self.budget = None  # naflex_budget of the model, once resolved

    def say(self, message):
        if self.verbose:
            print(f"[export] {message}", flush=True)

    def run(self, model_or_path, **source) -> Dict:
        """Exports the model `source` describes (export()'s source arguments); returns the report."""
        from keras_vit.export import report as report_lib

        replacing = install_lib.check_out(self.out, self.overwrite)
        for leftover in install_lib.remove_stale_staging(self.out):
            self.say(f"removed {leftover} (the staging folder of an export that was killed)")
        # Beside `out` (installing is a rename), and before any work: it proves `out` can be written.
        staging, made = install_lib.make_staging(self.out)
        try:
            src = self.resolve(model_or_path, **source)
            self.budget = naflex_budget(src.model, self.max_num_patches)
            formats, skipped = self.usable_formats(src.model)
            data = self.load_data(src.model, formats)
            self.announce(src, data)
            keras_row = self.measure_keras(src.model, model_or_path, data)
            version = self.saved_model_version(src.name)
            built = os.path.join(staging, "export")  # the new export, as `out` will hold it
            rows = self.build_all(formats, src, data, version, built, os.path.join(staging, "scratch"))
            report = self.report(src, formats, data, version, keras_row, rows, skipped, replacing)
            if report["report_path"] is not None:
                self.install(report, src, built)
        finally:
            install_lib.discard_staging(staging, made)
        if self.verbose:
            report_lib.print_table(report)
        return report

    # --- before any work: what to export, and to which formats ---------------------------------------

    def resolve(self, model_or_path, **source):
        from keras_vit.export import source as source_lib

        try:
            return source_lib.resolve(model_or_path, **source)
        except _BAD_INPUT as error:
            _as_export_error(error)

    def usable_formats(self, model):
        """([ExportFormat] to build, {skipped name: why}). Each format's check
        refuses what it cannot write: a format asked for stops the export
        (MissingExtra names the extra); a default one whose packages are
        missing is skipped, since the defaults are what this installation can write."""
        from keras_vit.model.quantization import quantization_of

        usable, skipped, mode = [], {}, quantization_of(model)
        for name in self.names:
            fmt = REGISTRY[name]
            if mode and fmt.refuses_quantized:
                why = f"{name} does not take a quantised ({mode}) model: {fmt.refuses_quantized}"
                if not self.by_default:
                    raise ExportError(why + ".")
                skipped[name] = why
                continue
            try:
                fmt.check(model)
            except MissingExtra as error:
                if not self.by_default:
                    raise
                skipped[name] = str(error)
                self.say(f"{name} skipped (a default format; its packages are not installed): {error}")
                continue
            except UserError as error:
                raise ExportError(f"{name}: {error}{_formats_that_work(model, name)}") from error
            usable.append(fmt)
        not_quantized = [name for name in skipped if mode and REGISTRY[name].refuses_quantized]
        if not_quantized:  # one line for them all: their reasons are one
            self.say(f"{', '.join(not_quantized)} skipped (default formats): a quantised ({mode}) model's TFLite "
                     f"is `tflite`; these quantise a float model themselves")
        if not usable:
            raise ExportError(f"None of the default formats can be written here: {'; '.join(skipped.values())}")
        return usable, skipped

    # --- data: validation and calibration images, and Keras' answers -------------------------------

    def load_data(self, model, formats: List[ExportFormat]) -> _Data:
        """Validation and calibration images, drawn across classes (seeded,
        stratified), never "the first N files" (in a class-sorted folder, the first classes only)."""
        from keras_vit.export import data as data_lib

        *size, channels = self.validation_size(model)
        size = tuple(size)
        try:
            if self.validation_data is None:
                data = _Data(data_lib.random_images(32, size, channels))
            else:
                data = _Data(data_lib.load(self.validation_data, size, channels))
            if any(fmt.calibrated for fmt in formats):
                self._calibration(data, size, channels)
            data.validation = data_lib.sample(data.validation, self.num_validation)
        except _BAD_INPUT as error:
            _as_export_error(error)
        return data

    def validation_size(self, model):
        """(height, width, channels) the artifacts are validated at: the model's input
        (serving.input_size), brought within the patch budget for a NaFlex model given one:
        serving_bytes reads an image of that size at that size, so both signatures see the
        pixels Keras saw (the table's own budget leaves image_size as it is)."""
        from keras_vit.export.serving import input_size
        from keras_vit.model.naflex import naflex_size

        height, width, channels = input_size(model)
        if self.max_num_patches is not None and self.budget is not None:
            height, width = naflex_size(height, width, model.config.total_stride, self.budget)
        return height, width, channels

    def _calibration(self, data: _Data, size, channels) -> None:
        from keras_vit.export import data as data_lib

        if self.calibration_data is not None:
            data.calibration = data_lib.load_sample(self.calibration_data, size, channels, self.num_calibration)
        elif self.validation_data is not None:
            # One source for both: calibrate on a sample across classes, validate on the others.
            data.calibration, data.validation, data.held_out = data_lib.split_calibration(
                data.validation, self.num_calibration)
        else:
            raise ExportError("tflite-int8 is calibrated on a representative sample of your data: pass "
                              + _console.either("--data FOLDER (a folder of your images, mnist, an .npz or a .npy)",
                                                "validation_data= or calibration_data= (a folder, an array, ...)")
                              + ".")

    def announce(self, src, data: _Data) -> None:
        from keras_vit.export import data as data_lib

        from keras_vit.export.serving import input_size, is_dynamic

        model = src.model
        height, width, channels = self.validation_size(model)
        any_size = " (SavedModel and ONNX take any size, TFLite any size at batch 1)" if is_dynamic(model) else ""
        calibration = ""
        if data.calibration is not None:
            calibration = f"; int8 calibration on {data_lib.describe(data.calibration)}" + (
                ", kept out of validation" if data.held_out else
                " (too few images to keep them out of validation)" if data.held_out is False else "")
        self.say(f"{src.description}: {model.count_params():,} parameters, "
                 f"input {height}x{width}x{channels}{any_size}, "
                 f"{len(src.labels)} classes; validating on {data_lib.describe(data.validation)} "
                 f"({data.validation.source}){calibration}")

    def measure_keras(self, model, model_or_path, data: _Data) -> Dict:
        """Keras' probabilities (the reference of every artifact), accuracy, latency and file size."""
        from keras_vit.export import serving

        traced = serving.traced_probabilities(model)  # one trace for the three
        data.reference = serving.keras_probabilities(model, data.validation.images, traced=traced)
        if data.calibration is not None:
            data.calibration_reference = serving.keras_probabilities(model, data.calibration.images, traced=traced)
        labels = data.validation.labels
        return {"accuracy": None if labels is None else float(np.mean(data.reference.argmax(1) == labels)),
                "latency_ms": _keras_latency(traced, data.validation.images[:1], self.latency_runs),
                "size_bytes": _source_size(model_or_path)}

    def saved_model_version(self, name: str) -> int:
        if self.version is not None:
            return int(self.version)
        return install_lib.next_version(os.path.join(self.out, name))

    # --- build, validate, install --------------------------------------------------------------------

    def build_all(self, formats, src, data: _Data, version: int, built: str, scratch: str) -> List[Dict]:
        os.makedirs(built)
        os.makedirs(scratch)
        images_file = os.path.join(scratch, "images.npy")  # what every runner reads
        np.save(images_file, data.validation.images)
        return [self.build_one(fmt, src, data, version, built, scratch, images_file) for fmt in formats]

    def install(self, report: Dict, src, built: str) -> None:
        """Adds labels.txt and report.json to the export in `built`, and makes `out` hold exactly it."""
        if any(row["passed"] for row in report["artifacts"]):
            storage.write_text(os.path.join(built, LABELS_FILE), "\n".join(src.labels) + "\n")
        storage.write_text(os.path.join(built, REPORT_FILE), json.dumps(report, indent=2, default=_json_default) + "\n")
        install_lib.install(built, self.out)

    def build_one(self, fmt: ExportFormat, src, data: _Data, version, built, scratch, images_file) -> Dict:
        """One format's report row: built, then validated in a fresh process; any failure is its row's."""
        from keras_vit.export import validate

        relative = fmt.relative_path(src.name, version)
        from keras_vit.model.quantization import quantization_of

        artifact = os.path.join(built, relative)
        limits = fmt.limits(self.thresholds, quantized=bool(quantization_of(src.model)))
        start = time.perf_counter()
        self.say(f"{fmt.name}: converting")
        try:
            os.makedirs(os.path.dirname(artifact), exist_ok=True)
            job = Build(src.model, src.labels, artifact, scratch, self.top_k, data.calibration,
                        data.calibration_reference, limits, max_num_patches=self.max_num_patches)
            with _console.quiet_conversion():  # the converters' chatter, not their errors
                notes = fmt.build(job)
            self.say(f"{fmt.name}: validating in a fresh process")
            row = validate.validate(fmt.name, artifact, images_file, data.reference, data.validation.labels,
                                    src.labels, scratch, latency_runs=self.latency_runs, thresholds=limits)
            row["notes"] = notes
            row = self._retry_on_agreement(fmt, job, row, data, src, scratch, images_file, limits)
        except Exception as error:  # noqa: BLE001 - a converter's failure is reported, the others go on
            if _raised_by_keras_vit(error):
                raise  # a bug of ours, not a limit of the format: its traceback (keras_vit.cli)
            row = {"format": fmt.name, "passed": False, "failures": [f"{type(error).__name__}: {error}"],
                   "thresholds": limits}
        if not row["passed"]:
            install_lib.discard(artifact, built)
        row["path"] = os.path.join(self.out, relative)
        row["seconds"] = round(time.perf_counter() - start, 1)
        self.say(f"{fmt.name}: {'ok' if row['passed'] else 'FAILED: ' + '; '.join(row['failures'])}")
        return row

    def _retry_on_agreement(self, fmt: ExportFormat, job, row, data: _Data, src, scratch, images_file, limits):
        """The row of the first of the format's further candidates (fmt.agreement_retries
        at most) that passes, while each one before missed only its top-1 agreement
        (near-ties flipped by int8 rounding; its accuracy within budget); else the last row.
        Every candidate is held to the same thresholds on the same images."""
        from keras_vit.export import report as report_lib
        from keras_vit.export import validate

        rejected = []
        while (not row["passed"] and job.attempt < fmt.agreement_retries
               and report_lib.only_agreement_failed(row, limits)):
            rejected.append({"plan": row["notes"].get("plan"), "top1_agreement": row["top1_agreement"],
                             "accuracy_drop": row.get("accuracy_drop")})
            job.attempt += 1
            try:
                with _console.quiet_conversion():
                    notes = fmt.build(job)
            except NoOtherCandidate:
                break
            self.say(f"{fmt.name}: top-1 agreement {row['top1_agreement']:.2%}, accuracy within budget: "
                     f"validating its next candidate ({notes.get('plan', f'attempt {job.attempt + 1}')})")
            row = validate.validate(fmt.name, job.path, images_file, data.reference, data.validation.labels,
                                    src.labels, scratch, latency_runs=self.latency_runs, thresholds=limits)
            row["notes"] = notes
        if rejected:
            row["notes"]["failed_validation"] = rejected
        return row

    def report(self, src, formats, data: _Data, version, keras_row, rows, skipped, replacing) -> Dict:
        """The report; `report_path` None when nothing is installed (a failed export replacing one)."""
        from keras_vit.export import data as data_lib
        from keras_vit.export.serving import input_size, is_dynamic

        passed = all(row["passed"] for row in rows)
        install = passed or not replacing
        for row in rows:
            row["installed"] = install and row["passed"]
        model, validation, calibration = src.model, data.validation, data.calibration
        names = [fmt.name for fmt in formats]
        return {
            "model": {"name": src.name, "source": src.description, "parameters": int(model.count_params()),
                      "input_shape": list(input_size(model)), "dynamic_image_size": is_dynamic(model),
                      "num_classes": len(src.labels),
                      "saved_model_version": version if "saved_model" in names else None,
                      **({} if self.budget is None else {"max_num_patches": self.budget})},
            "validation": {"num_images": len(validation), "num_classes": data_lib.num_classes_in(validation),
                           "source": validation.source, "labels": validation.labels is not None,
                           "sampling": f"stratified across classes, seed {data_lib.SAMPLE_SEED}",
                           "calibration_images": None if calibration is None else len(calibration),
                           "calibration_classes": data_lib.num_classes_in(calibration),
                           "calibration_held_out": data.held_out},
            "keras": keras_row,
            "artifacts": rows,
            "skipped": skipped,
            "passed": passed,
            "out": self.out,
            "report_path": os.path.join(self.out, REPORT_FILE) if install else None,
        }


def _run_task(model_or_path):
    """The Task of a run folder (or its model.keras) whose model is not a classifier, else None."""
    import keras

    from keras_vit.tasks import run_task
    from keras_vit.utils import storage

    if isinstance(model_or_path, keras.Model) or not storage.exists(os.fspath(model_or_path)):
        return None
    return run_task(model_or_path)


def naflex_budget(model, max_num_patches=None) -> Optional[int]:
    """The patch budget serving_bytes reads a NaFlex model's images within (the report's
    model.max_num_patches); None for any other model, which `max_num_patches` must then leave out."""
    from keras_vit.model.naflex import is_naflex, patch_budget

    budget = patch_budget(model, max_num_patches)  # refuses a budget that does not apply
    return budget if is_naflex(model) else None


def _as_export_error(error):
    """Raises `error` as an ExportError (bad input to the export), unless it
    already is one or names a missing extra (kept, so its one line says which)."""
    if isinstance(error, (ExportError, MissingExtra)):
        raise error
    raise ExportError(str(error)) from error


def _keras_latency(fn, image, runs):
    """Median ms of single-image calls of `fn` (serving.traced_probabilities: the model's graph)."""
    import tensorflow as tf

    x = tf.constant(image)
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(x).numpy()
        times.append(time.perf_counter() - start)
    return 1000.0 * float(np.median(times))


def _source_size(model_or_path):
    from keras_vit import runs

    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        path = storage.join(path, runs.MODEL_FILE) if storage.isdir(path) else path
        if storage.isfile(path):
            return storage.getsize(path)
    return None


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
