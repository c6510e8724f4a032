"""Checkpoints: the official key layout and strict loader, one adapter per other source
(HF transformers, timm, keras-hub), position-embedding resize, downloads.

The names below are imported on first use: the table of published checkpoints (hub)
needs no Keras, so `keras-vit variants` lists it without starting TensorFlow."""

from keras_vit.utils.lazy import lazy_exports

_LAZY = {
    "CHECKPOINTS": "keras_vit.weights.hub",
    "available_weights": "keras_vit.weights.hub",
    "checkpoint_url": "keras_vit.weights.hub",
    "variables_by_key": "keras_vit.weights.layout",
    "checkpoint_params": "keras_vit.weights.npz",
    "load_checkpoint": "keras_vit.weights.npz",
    "read_npz": "keras_vit.weights.npz",
    "save_weights": "keras_vit.weights.npz",
    "resize_position_embedding": "keras_vit.weights.resize",
    "save_pretrained": "keras_vit.weights.hf",
    "load_weights": "keras_vit.weights.sources",
    "open_checkpoint": "keras_vit.weights.sources",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
