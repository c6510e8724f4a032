"""Exporters: SavedModel (TF Serving), TFLite (float32, float16, dynamic and
calibrated int8), ONNX, HF transformers; every artifact validated against the
Keras model in a fresh process. Each format is an ExportFormat declared by its
module and collected in REGISTRY (keras_vit.export.registry).

    from keras_vit.export import export, print_table
    report = export("runs/demo", "saved_model,tflite,tflite-int8", "exports/demo", validation_data="mnist")
"""

import os as _os
import sys as _sys

from keras_vit.utils.lazy import lazy_exports


def _require_tensorflow():
    from keras_vit.utils.backend_guard import require_tensorflow

    require_tensorflow("keras_vit.export (SavedModel, TFLite and ONNX export)")


# Refuse at import time when another backend is chosen (checked without
# importing Keras unless it already is); else on first use.
if "keras" in _sys.modules or _os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    _require_tensorflow()

# Imported on first use (PEP 562): `keras-vit export --help` starts no TensorFlow.
__getattr__, __dir__ = lazy_exports(__name__, {
    **{name: "keras_vit.export.pipeline" for name in ("FORMATS", "OPTIONAL_FORMATS", "ExportError", "ExportFailed",
                                                      "Exporter", "export", "parse_formats")},
    **{name: "keras_vit.export.registry" for name in ("REGISTRY",)},
    **{name: "keras_vit.export.format" for name in ("ExportFormat",)},
    **{name: "keras_vit.export.report" for name in ("THRESHOLDS", "format_table", "print_table")},
}, before=_require_tensorflow)

__all__ = ["FORMATS", "OPTIONAL_FORMATS", "REGISTRY", "THRESHOLDS", "ExportError", "ExportFailed", "ExportFormat",
           "Exporter", "export", "format_table", "parse_formats", "print_table"]
