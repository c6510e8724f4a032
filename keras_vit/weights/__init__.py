"""Checkpoints: the official key layout and strict loader, one adapter per other source
(HF transformers, timm, keras-hub), position-embedding resize, downloads."""

from keras_vit.weights.hub import CHECKPOINTS, available_weights, checkpoint_url
from keras_vit.weights.layout import variables_by_key
from keras_vit.weights.npz import (
    checkpoint_params,
    load_checkpoint,
    read_npz,
    save_weights,
)
from keras_vit.weights.resize import resize_position_embedding
from keras_vit.weights.hf import save_pretrained
from keras_vit.weights.sources import load_weights, open_checkpoint

__all__ = [
    "CHECKPOINTS", "available_weights", "checkpoint_params", "checkpoint_url", "load_checkpoint",
    "load_weights", "open_checkpoint", "read_npz", "resize_position_embedding", "save_pretrained", "save_weights",
    "variables_by_key",
]
