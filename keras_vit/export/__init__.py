"""Exporters: SavedModel (TF Serving), TFLite (float32, float16, dynamic and
calibrated int8), ONNX; every artifact validated against the Keras model in a
fresh process (installed as keras_vit.export).

    from keras_vit.export import export, print_table
    report = export("runs/demo", "saved_model,tflite,tflite-int8", "exports/demo", validation_data="mnist")
"""

from keras_vit.backend_guard import require_tensorflow

require_tensorflow("keras_vit.export (SavedModel, TFLite and ONNX export)")

from keras_vit.export.pipeline import FORMATS, ExportError, ExportFailed, export, parse_formats
from keras_vit.export.report import THRESHOLDS, format_table, print_table

__all__ = ["FORMATS", "THRESHOLDS", "ExportError", "ExportFailed", "export", "format_table", "parse_formats",
           "print_table"]
