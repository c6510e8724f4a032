"""keras-hub ViT presets (a `save_to_preset` directory, or a preset name that
keras-hub's own downloader fetches), read through keras-hub itself.

keras-hub's ViT is the official architecture in Keras layers: its variable
paths ("vit_encoder/transformer_block_1/mha/query/kernel", ...) already have
the official shapes, so mapping is renaming. Its numerics are its own: the
exact GELU (Keras' "gelu") and the preset's layer_norm_epsilon.
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np

from keras_vit.config import ViTConfig
from keras_vit.errors import MissingExtra, UserError, install_hint
from keras_vit.weights.checkpoint import POSEMB_KEY, Checkpoint, keras_block, rename
from keras_vit.weights.layout import ENCODER_NORM


def _keras_hub():
    try:
        import keras_hub
    except ImportError as error:
        raise MissingExtra(f"Reading keras-hub presets needs keras-hub: pip install 'keras-hub>=0.32' "
                           f"(or {install_hint('reference')}).") from error
    return keras_hub


def _load(preset, where):
    """The preset's ViTImageClassifier when it has a task (head), else its ViTBackbone."""
    keras_hub = _keras_hub()
    has_task = os.path.isfile(os.path.join(preset, "task.json")) if os.path.isdir(preset) else None
    try:
        if has_task is not False:
            try:
                task = keras_hub.models.ImageClassifier.from_preset(preset)
                return task, task.backbone
            except (ValueError, FileNotFoundError):
                if has_task:
                    raise
        return None, keras_hub.models.Backbone.from_preset(preset)
    except Exception as error:
        if isinstance(error, ImportError):
            raise
        raise UserError(
            f"keras-hub could not load the preset {where} ({type(error).__name__}: {error}). If this machine "
            f"is offline, copy the preset directory (config.json + model.weights.h5) here and pass its path."
        ) from error


def config_from_kerashub(backbone, task, where: str) -> ViTConfig:
    c = backbone.get_config()
    name = type(backbone).__name__
    if name != "ViTBackbone":
        raise UserError(f"{where} is a keras-hub {name}, not a ViTBackbone.")
    for flag in ("use_mha_bias", "use_mlp_bias", "use_patch_bias"):
        if not c.get(flag, True):
            raise UserError(f"{where} has {flag}=False: keras-vit's layers always have these biases, so this "
                            f"layout cannot be expressed.")
    patch = c["patch_size"]
    patch = tuple(patch) if isinstance(patch, (list, tuple)) else (patch, patch)
    if patch[0] != patch[1]:
        raise UserError(f"{where} has non-square patches {patch}; keras-vit's patches are square.")
    token = c.get("use_class_token", True)
    pooling = task.get_config().get("pooling", "token") if task is not None else ("token" if token else "gap")
    if (pooling == "token") != bool(token):
        raise UserError(f"{where} pools with {pooling!r} {'with' if token else 'without'} a class token; "
                        f"keras-vit reads the class token (classifier='token') or averages a model without "
                        f"one (classifier='gap').")
    representation = task.get_config().get("intermediate_dim") if task is not None else None
    return ViTConfig(
        patch_size=int(patch[0]), hidden_size=int(c["hidden_dim"]), mlp_dim=int(c["mlp_dim"]),
        num_heads=int(c["num_heads"]), num_layers=int(c["num_layers"]), classifier=pooling,
        representation_size=representation, layer_norm_epsilon=float(c.get("layer_norm_epsilon", 1e-6)),
        gelu_approximate=False,  # keras-hub's MLP uses Keras' "gelu": approximate=False
    )


# keras-hub's TransformerEncoder names for our parts (layout.BLOCK_PARTS).
_BLOCK = dict(query="mha/query", key="mha/key", value="mha/value", out="mha/attention_output", norm1="ln_1",
              norm2="ln_2", fc1="mlp/dense_1", fc2="mlp/dense_2")


def params_from_kerashub(tensors: Dict[str, np.ndarray], config: ViTConfig) -> Dict[str, np.ndarray]:
    e = "vit_patching_and_embedding/"
    table = {
        "cls": (e + "class_token", None),
        POSEMB_KEY: (e + "position_embedding/embeddings", lambda t: t[None]),
        "embedding/kernel": (e + "patch_embedding/kernel", None),
        "embedding/bias": (e + "patch_embedding/bias", None),
        ENCODER_NORM + "/scale": ("vit_encoder/ln/gamma", None),
        ENCODER_NORM + "/bias": ("vit_encoder/ln/beta", None),
        "pre_logits/kernel": ("pre_logits/kernel", None),
        "pre_logits/bias": ("pre_logits/bias", None),
        "head/kernel": ("predictions/kernel", None),
        "head/bias": ("predictions/bias", None),
    }
    for i in range(config.num_layers):  # keras-hub counts its blocks from 1
        keras_block(table, i, f"vit_encoder/transformer_block_{i + 1}/", _BLOCK)
    return rename(tensors, table)


def read_kerashub(preset, source=None) -> Checkpoint:
    """A keras-hub ViT preset (directory or name) as a Checkpoint."""
    preset = os.fspath(preset)
    where = source or preset
    task, backbone = _load(preset, where)
    config = config_from_kerashub(backbone, task, where)
    model = task if task is not None else backbone
    # Variable paths are relative to the layer that owns them, so a task's and its backbone's agree.
    tensors = {variable.path: np.asarray(variable.numpy()) for variable in model.weights}
    params = params_from_kerashub(tensors, config)
    height, width, channels = backbone.get_config()["image_shape"]
    return Checkpoint(config=config, params=params, image_size=(int(height), int(width)), source=where,
                      num_channels=int(channels))
