"""Strict loading and saving of official-format `.npz` checkpoints."""

from __future__ import annotations

import os
import zipfile
from typing import Dict, Mapping

import numpy as np

from keras_vit.utils import console as _console, storage
from keras_vit.errors import UserError
from keras_vit.weights.layout import is_lora_key, official_layout_error, variables_by_key
from keras_vit.weights.parts import CLASSIFIER_ROOTS
from keras_vit.weights.resize import COLUMN_SUFFIX, POSEMB_1D_SUFFIX, RELATIVE_SUFFIX, ROW_SUFFIX, \
    resize_position_params
from keras_vit.weights.patch_resize import resize_patch_params


def read_npz(path) -> Dict[str, np.ndarray]:
    """Reads a checkpoint file into {key: array}; ValueError if it is not one."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"Checkpoint file {path!r} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: np.asarray(data[key]) for key in data.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise UserError(
            f"{path!r} is not a readable .npz checkpoint ({type(error).__name__}: {error}). "
            f"It may be truncated or corrupt: delete it and download it again."
        ) from error


def _is_group_norm_param(key: str) -> bool:
    leaf_parent = key.rsplit("/", 2)[-2] if key.count("/") else ""
    return leaf_parent.startswith("gn")


def load_checkpoint(model, params: Mapping[str, np.ndarray], old_grid=None, new_head: bool = False) -> None:
    """Assigns official-format `params` to `model`, checking every key and shape.

    Allowed differences, each named in one warning line (keras_vit.utils.console.warn):
    - a head of another class count (or none in the file) -> a new zero head
      (said unless `new_head`: the caller left the file's head out on purpose);
    - a model without the representation layer -> "pre_logits" is dropped;
    - a model without a head -> the file's head is ignored;
    - another position grid -> the position weights are resized by the rule
      of their kind (keras_vit.weights.resize; class token kept);
    - another patch size -> the patch kernel is resized by FlexiViT's
      pseudo-inverse rule (keras_vit.weights.patch_resize);
    - a model with LoRA updates (ViTConfig.lora_rank), a checkpoint
      without them -> the updates keep their initial values (said by no
      warning: B starts at zero, so the model computes the checkpoint's
      function).
    Learned position weights of another kind than the model's
    position_embedding are a one-line ValueError; anything else missing,
    extra or mis-shaped is a ValueError naming it.
    Nothing is assigned unless every check passes. `old_grid` (rows, cols):
    the patch grid `params` were made for, when known (a 1-D table's grid is
    otherwise taken to be square, as in every official checkpoint).
    """
    if model.config.quantization:  # float values cast into int8 variables would silently be zeros
        raise UserError(f"{model.name} is built {model.config.quantization} (quantization="
                        f"{model.config.quantization!r}): load the weights into the float model, then "
                        f"keras_vit.quantize(model, {model.config.quantization!r}).")
    params = dict(params)
    expected = variables_by_key(model)

    for key in list(params):
        # BiT-style checkpoints may store GroupNorm scale/bias as (1, 1, 1, C).
        if _is_group_norm_param(key) and params[key].ndim == 4:
            params[key] = params[key].reshape(-1)

    for head in CLASSIFIER_ROOTS:  # the head, and DeiT's second one on the distillation token
        _fit_head(head, params, expected, new_head)

    if model.pre_logits is None and "pre_logits/kernel" in params:
        _console.warn("dropping the checkpoint's representation layer (pre_logits), since the model has "
                      "representation_size=None.")
        params.pop("pre_logits/kernel", None)
        params.pop("pre_logits/bias", None)

    held, wanted = position_kind(params), model.config.position_embedding
    if held is not None and held != wanted:
        raise UserError(f"The checkpoint holds a {held} position embedding but {model.name} uses "
                        f"position_embedding={wanted!r}: build the model with position_embedding={held!r}, or "
                        f"train the {wanted} kind from scratch.")
    shapes = {key: tuple(variable.shape) for key, variable in expected.items()}
    # The position table's prefix is the class and distillation tokens (registers have no positions).
    params, resized = resize_position_params(params, shapes, model.grid_size,
                                             model.config.num_positioned_prefix_tokens, old_grid,
                                             method=model.config.position_interpolation)
    params, kernel_resized = resize_patch_params(params, shapes)
    resized += kernel_resized
    for what in resized:
        _console.warn(f"resizing {what}.")

    # A model with LoRA updates takes its base's checkpoint: updates the file lacks keep their
    # initial values (B = 0, so the model computes the checkpoint's function).
    expected = {key: variable for key, variable in expected.items() if key in params or not is_lora_key(key)}
    missing = sorted(set(expected) - set(params))
    unexpected = sorted(set(params) - set(expected))
    mismatched = [
        f"{key}: checkpoint {tuple(params[key].shape)}, model {tuple(expected[key].shape)}"
        for key in sorted(set(expected) & set(params))
        if tuple(params[key].shape) != tuple(expected[key].shape)
    ]
    if missing or unexpected or mismatched:
        lines = ["The checkpoint does not match the model's architecture "
                 f"({model.name}, {model.config}):"]
        if missing:
            lines.append(f"  missing from the checkpoint ({len(missing)}): {', '.join(missing[:10])}"
                         + (" ..." if len(missing) > 10 else ""))
        if unexpected:
            lines.append(f"  not in the model ({len(unexpected)}): {', '.join(unexpected[:10])}"
                         + (" ..." if len(unexpected) > 10 else ""))
        if mismatched:
            lines.append(f"  shape mismatches ({len(mismatched)}): " + "; ".join(mismatched[:10]))
        lines.append("Build the model with the variant (and representation_size) the checkpoint was saved from.")
        raise UserError("\n".join(lines))

    for key, variable in expected.items():
        variable.assign(params[key].astype(np.float32))


def _fit_head(head, params, expected, new_head=False):
    """A checkpoint's `head` kept when it fits the model's; else dropped (no such head in the
    model) or replaced by zeros (another class count, or none in the file: the fine-tuning convention)."""
    kernel, bias = f"{head}/kernel", f"{head}/bias"
    if kernel not in expected:
        params.pop(kernel, None)
        params.pop(bias, None)
        return
    have, want = params.get(kernel), tuple(expected[kernel].shape)
    if have is not None and tuple(have.shape) == want:
        return
    found = "no head" if have is None else f"a head of {have.shape[-1]} classes"
    if head == "head" and not new_head:  # one line for the pair
        _console.warn(f"the checkpoint has {found}; the model's head ({want[-1]} classes) starts at zero "
                      f"(the fine-tuning convention).")
    params[kernel] = np.zeros(want, np.float32)
    params[bias] = np.zeros(tuple(expected[bias].shape), np.float32)


def position_kind(params):
    """The kind of learned position weights among `params`' keys ("learned_1d",
    "learned_2d", "relative"), or None when it holds none ("sincos_2d" and
    "none" have no weights, so they load into each other)."""
    for kind, suffixes in (("learned_1d", (POSEMB_1D_SUFFIX,)), ("learned_2d", (ROW_SUFFIX, COLUMN_SUFFIX)),
                           ("relative", (RELATIVE_SUFFIX,))):
        if any(key.endswith(suffixes) for key in params):
            return kind
    return None


def checkpoint_params(model) -> Dict[str, np.ndarray]:
    """The model's weights as an official-format {key: float32 array} (position
    weights the official layout lacks under keys of our own, see layout)."""
    if model.config.quantization:
        raise UserError(f"{model.name} holds {model.config.quantization} weights (keras_vit.quantize), which do "
                        f"not turn back into the float weights a checkpoint holds: use the float model it was "
                        f"quantised from.")
    return {key: np.asarray(variable.numpy(), np.float32) for key, variable in variables_by_key(model).items()}


def save_weights(model, path) -> str:
    """Writes the model's weights as an official-format `.npz` (atomically).
    Only the official position embedding ("learned_1d") fits that format:
    other kinds are a ValueError saying to save a `.keras` file instead."""
    problem = official_layout_error(model, "the official .npz layout")
    if problem:
        raise UserError(problem)
    path = os.fspath(path)
    if not path.endswith(".npz"):
        raise UserError(f"Checkpoint paths end in .npz, got {path!r}.")
    params = checkpoint_params(model)
    storage.makedirs(storage.dirname(storage.abspath(path)))
    storage.write_bytes(path, lambda f: np.savez(f, **params))
    return path
