"""Exporters: SavedModel, TFLite, ONNX (installed as keras_vit.export)."""
