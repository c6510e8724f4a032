"""TFLite: float32, float16, dynamic-range int8 and calibrated int8, builtin ops only.

Every variant takes float32 (1, H, W, C) pixels 0..255 (preprocessing inside)
and returns float32 (1, classes) probabilities; the int8 models quantise and
dequantise at their edges, so an app feeds camera pixels as they are.

Conversion goes through a SavedModel of that one function (converting a
concrete function with the Keras model as its trackable silently produces a
broken model). Only TFLITE_BUILTINS are allowed: a Flex (SELECT_TF_OPS) or
custom op fails the export, since most runtimes on phones do not carry them.

Full-integer int8 (calibrated, with its search for what stays float) is
keras_vit.export.tflite_int8; this module declares the other three formats.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from keras_vit.utils import storage
from keras_vit.errors import CannotContinue, UserError, require
from keras_vit.export.format import EXACT, Build, ExportFormat

KINDS = {
    "tflite": "float32",
    "tflite-fp16": "float16 weights",
    "tflite-dynamic": "dynamic-range int8 (int8 weights, float activations)",
    "tflite-int8": "int8 weights and activations, calibrated",
}
BYTES_PER_PARAMETER = {"tflite": 4, "tflite-fp16": 2, "tflite-dynamic": 1, "tflite-int8": 1}
FLATBUFFER_LIMIT = 2 * 1024**3  # TFLite models are single flatbuffers (< 2 GiB).
LABELS_METADATA = "labels"  # the metadata entry holding the class names, one per line
SOURCE_DIR = "tflite_source"  # in the shared scratch folder: one converter source for every kind
FOREIGN_OPS = ("CUSTOM", "DELEGATE")  # besides Flex*: ops a phone's builtin-only runtime lacks
FILE_IDENTIFIER = b"TFL3"  # schema.fbs' file_identifier: every .tflite flatbuffer carries it


class UnsupportedOpsError(CannotContinue):
    """The converted model holds ops a builtin-only TFLite runtime lacks (Flex, custom, delegate)."""


def check(model, kind):
    if kind not in KINDS:
        raise UserError(f"Unknown TFLite kind {kind!r}; known: {', '.join(KINDS)}.")
    require("ai_edge_litert", "tflite", "TFLite export (validated with the LiteRT interpreter)")
    from keras_vit.model.quantization import quantization_of

    # A quantised model's tflite stores its weights as int8 (QUANTIZED_KIND below).
    bytes_needed = model.count_params() * BYTES_PER_PARAMETER["tflite-dynamic" if quantization_of(model) else kind]
    if bytes_needed >= FLATBUFFER_LIMIT:
        raise UserError(f"{model.name} has {model.count_params():,} parameters: as {kind} that is "
                         f"{bytes_needed / 2**30:.1f} GiB, over the 2 GiB a TFLite flatbuffer can hold.")


def write_source(model, path):
    """The SavedModel the converter reads: batch 1, pixels in, probabilities out;
    any height and width for a dynamic model (the LiteRT interpreter is then
    resized to each input with resize_tensor_input)."""
    import tensorflow as tf

    from keras_vit.export import archive, serving
    from keras_vit.model.quantization import dequantized

    model = dequantized(model)  # a quantised model's weights as floats, which `convert` stores as int8
    height, width, channels = serving.input_size(model)
    if serving.is_dynamic(model):
        height = width = None
    # Each weight once (keras_vit.export.archive): the converter loads all the SavedModel holds.
    archive.write(path, {"serving_default": (
        lambda images: {"probabilities": serving.probabilities(model, images)},
        [tf.TensorSpec((1, height, width, channels), tf.float32, name="images")])})


def convert(source_dir, kind, calibration=None, reference=None, max_accuracy_drop=0.01,
            min_agreement=0.98, quantize=None, quantized=None) -> (bytes, Dict):
    """Converts the SavedModel `source_dir`; returns the flatbuffer and notes for the report.

    For "tflite-int8", `quantize` (keras_vit.export.tflite_int8.quantize, passed
    in because that module builds on this one) calibrates on `calibration`
    (Images) and chooses its denylist by `reference` (Keras probabilities on
    those images). `quantized`: the source model's quantisation mode (its
    `tflite` stores int8 weights), None for a float model.
    """
    import tensorflow as tf

    converter = _converter(source_dir)
    notes = {"quantization": KINDS[kind]}
    if kind == "tflite-fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif kind == "tflite-dynamic" or quantized:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        notes["quantization"] = KINDS["tflite-dynamic"] + (f", from the model's {quantized} weights" if quantized else "")
    if kind == "tflite-int8":
        if quantize is None:
            raise TypeError("tflite-int8 is converted by keras_vit.export.tflite_int8: pass quantize=tflite_int8.quantize")
        content, int8_notes = quantize(converter, calibration, reference, max_accuracy_drop, min_agreement)
        notes.update(int8_notes)
    else:
        content = converter.convert()
    notes["ops"] = builtin_ops(content)
    return content, notes


def build(job: Build, kind: str, quantize=None) -> Dict:
    """Writes the `kind` flatbuffer to job.path, the class names in its metadata."""
    import os

    from keras_vit.model.quantization import quantization_of

    source = os.path.join(job.scratch, SOURCE_DIR)
    if not os.path.isdir(source):  # the kinds of one export share it
        write_source(job.model, source)
    content, notes = convert(source, kind, job.calibration, job.calibration_reference,
                             max_accuracy_drop=job.thresholds.get("max_accuracy_drop") or 0.01,
                             min_agreement=job.thresholds.get("min_agreement") or 0.98, quantize=quantize,
                             quantized=quantization_of(job.model))
    storage.write_bytes(job.path, with_labels(content, job.labels))
    notes["metadata"] = {LABELS_METADATA: "the class names, one per line"}
    return notes


def with_labels(content: bytes, labels) -> bytes:
    """The flatbuffer with the class names (labels.txt's text) as its
    LABELS_METADATA entry, so that the file alone says what its outputs mean.
    A metadata entry is a named buffer the interpreter ignores: the model
    runs exactly as converted."""
    schema = _schema()
    model = _unpack(content)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer("".join(f"{label}\n" for label in labels).encode("utf-8"), np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = LABELS_METADATA, len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if m.name != LABELS_METADATA.encode()] + [entry]
    return _pack(model)


def read_labels(content: bytes) -> Optional[List[str]]:
    """The class names `with_labels` stored in a .tflite file's content; None when it has none."""
    model = _unpack(content)
    for entry in model.metadata or []:
        if entry.name in (LABELS_METADATA, LABELS_METADATA.encode()):
            text = bytes(model.buffers[entry.buffer].data).decode("utf-8")
            return text.split("\n")[:-1]
    return None


def _schema():
    """The TFLite file format's classes: flatc's Python for schema.fbs (the
    format's definition), as LiteRT ships it with its interpreter (the tflite
    extra). Neither TF nor LiteRT has a public call that adds or reads a
    metadata entry, and TF's own copy of these classes (tensorflow.lite.python)
    is private to TF, whose tf.lite gives way to LiteRT. LiteRT's module is not
    in its API reference either: docs/architecture.md lists it among the
    private APIs still used, and tests/test_private_apis.py guards it."""
    require("ai_edge_litert", "tflite", "Reading and writing .tflite files")
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def _unpack(content: bytes):
    """The flatbuffer as the schema's object tree (flatbuffers' object API)."""
    return _schema().ModelT.InitFromPackedBuf(bytearray(content), 0)


def _pack(model) -> bytes:
    """The object tree `_unpack` gave, as a .tflite flatbuffer again."""
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def _converter(source_dir):
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(source_dir)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter


def op_names(content: bytes) -> List[str]:
    """The operators a .tflite flatbuffer uses, read from its operator codes
    (the schema, not the interpreter's private op listing): builtin names such
    as "FULLY_CONNECTED", and a custom op's own name ("FlexErf" for Flex)."""
    builtin = {code: name for name, code in vars(_schema().BuiltinOperator).items() if name.isupper()}
    model = _unpack(content)
    names = set()
    for code in model.operatorCodes or []:
        # Codes above 127 live in builtinCode only; older files in deprecatedBuiltinCode (the schema's rule).
        number = max(code.builtinCode, code.deprecatedBuiltinCode)
        name = builtin.get(number, f"BUILTIN_{number}")
        names.add(code.customCode.decode() if name == "CUSTOM" and code.customCode else name)
    return sorted(names)


def builtin_ops(content: bytes) -> List[str]:
    """The model's op names; raises UnsupportedOpsError on Flex or custom ops,
    or when the LiteRT interpreter cannot load it."""
    names = op_names(content)
    foreign = [n for n in names if n not in _builtin_names() or n in FOREIGN_OPS]
    if foreign:
        raise UnsupportedOpsError(f"The TFLite model needs non-builtin ops {foreign} (Flex/SELECT_TF_OPS or "
                                  f"custom): a phone's TFLite runtime would refuse it.")
    from ai_edge_litert.interpreter import Interpreter

    try:
        Interpreter(model_content=content)
    except (RuntimeError, ValueError) as error:
        raise UnsupportedOpsError(f"The TFLite model does not load with builtin ops only: {error}") from error
    return names


def _builtin_names():
    return {name for name in vars(_schema().BuiltinOperator) if name.isupper()}


def predict(content: bytes, images: np.ndarray) -> np.ndarray:
    """In-process TFLite inference, (N, H, W, C) -> (N, classes), one image per call."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    input_index = interpreter.get_input_details()[0]["index"]
    # A resizable input (a dynamic model's: -1 for height and width) takes the images' size.
    interpreter.resize_tensor_input(input_index, [1, *np.shape(images)[1:]])
    interpreter.allocate_tensors()
    output_index = interpreter.get_output_details()[0]["index"]
    outputs = []
    for image in images:
        interpreter.set_tensor(input_index, image[None].astype(np.float32))
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(output_index)[0].copy())
    return np.stack(outputs)


# A quantised model (keras_vit.quantize) goes to TFLite as its `tflite`: the weights its
# projections multiply by, stored as TFLite's int8 (TFLite has no int4 kernels for them) with
# activations quantised on the fly, as tflite-dynamic's; held to tflite-dynamic's thresholds.
QUANTIZED_KIND = "tflite"
ONLY_FLOAT = ("it quantises a float model itself: a quantised model's TFLite is `tflite` (its weights as "
              "TFLite int8); export the float model for this kind")


def _format(kind, layout, description, thresholds, quantized_thresholds=None):
    return ExportFormat(name=kind, description=description, layout=layout, runtime="tflite",
                        build=lambda job: build(job, kind), check=lambda model: check(model, kind),
                        thresholds=thresholds, extra="tflite", quantized_thresholds=quantized_thresholds,
                        refuses_quantized="" if kind == QUANTIZED_KIND else ONLY_FLOAT)


# int8 weights, activations quantised on the fly per call.
DYNAMIC_THRESHOLDS = {"max_abs_diff": None, "min_agreement": 0.98, "max_accuracy_drop": 0.01}

EXPORT_FORMATS = (
    _format("tflite", "{name}.tflite", "TFLite float32 (a quantised model's: int8 weights), builtin ops only, "
            "run by LiteRT", EXACT, quantized_thresholds=DYNAMIC_THRESHOLDS),
    # float16 weights: ~3 significant digits.
    _format("tflite-fp16", "{name}.fp16.tflite", "TFLite with float16 weights",
            {"max_abs_diff": 1e-2, "min_agreement": 0.99, "max_accuracy_drop": 0.005}),
    _format("tflite-dynamic", "{name}.dynamic-int8.tflite", "TFLite dynamic-range int8 (int8 weights)",
            DYNAMIC_THRESHOLDS),
)
