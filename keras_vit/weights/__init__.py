"""Official checkpoints: key layout, strict load/save, position-embedding resize, download."""

from keras_vit.weights.hub import CHECKPOINTS, available_weights, checkpoint_url
from keras_vit.weights.layout import variables_by_key
from keras_vit.weights.npz import (
    checkpoint_params,
    load_checkpoint,
    load_weights,
    read_npz,
    save_weights,
)
from keras_vit.weights.resize import resize_position_embedding

__all__ = [
    "CHECKPOINTS", "available_weights", "checkpoint_params", "checkpoint_url", "load_checkpoint",
    "load_weights", "read_npz", "resize_position_embedding", "save_weights", "variables_by_key",
]
