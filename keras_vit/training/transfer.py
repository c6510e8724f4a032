"""Initial weights for a run: official checkpoints, `.keras` models, workdirs.

An official name or `.npz` goes to keras_vit.load_weights. A `.keras` file (or
a training workdir, meaning its model.keras) is read outside any strategy
scope, the ViT inside it is found by type (it may be wrapped, e.g. by a
masked-patch pre-training model), and its weights are transferred in the
official key layout: the head is dropped (the new one starts at zero; DeiT's
distillation head "head_dist" with it), the
representation layer is dropped if the new model has none, and the position
embedding is resized to the new grid.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, Union

import numpy as np

from keras_vit import runs
from keras_vit.utils import console as _console, storage
from keras_vit.runs import source as model_source
from keras_vit.errors import UserError
from keras_vit.weights import checkpoint_params, load_checkpoint, load_weights
from keras_vit.weights.sources import NAME_PREFIXES, check_weights_exist, open_checkpoint
from keras_vit.config import ViTConfig
from keras_vit.model import ViT, head_layers, vits_in
from keras_vit.model.lora import merge_lora
from keras_vit.weights.parts import is_classifier


@dataclasses.dataclass
class InitialWeights:
    """What `--weights` resolved to: something keras_vit.load_weights takes
    (a name, a path, or a params dict) and, for a Keras source, its architecture."""

    weights: Union[str, dict]
    source_config: Optional[ViTConfig] = None
    num_channels: int = 3
    description: str = ""
    dropped_head: Optional[int] = None  # classes of the head the weights had, left out on purpose


def find_vit(model) -> ViT:
    """The ViT in `model`: the model itself or the first nested ViT layer."""
    vits = vits_in(model)
    if not vits:
        raise UserError(f"{model.name} contains no keras_vit.ViT to take encoder weights from.")
    return vits[0]


def resolve_weights(weights: Optional[str]) -> Optional[InitialWeights]:
    if weights is None:
        return None
    check_weights_exist(weights)  # before anything else: a mistyped name would be taken for a path
    path = os.fspath(weights)
    if path.startswith(NAME_PREFIXES) or (model_source.is_checkpoint(path) and os.path.isdir(path)):
        # An HF transformers, keras-hub or timm folder or hub name ("hf:ORG/NAME"), as predict/export
        # take it: its architecture too.
        checkpoint = open_checkpoint(path)
        return InitialWeights(_encoder(checkpoint.params), checkpoint.config, checkpoint.num_channels, f"checkpoint {path}",
                              _head_classes(checkpoint.params))
    if storage.isdir(path) or path.endswith(".keras"):
        try:
            source = merge_lora(find_vit(runs.load_model(path)))  # an unmerged LoRA model: its function
        except runs.ModelFileError as error:
            raise UserError(f"{_console.either('--weights', 'weights')}: {error}") from None
        params = checkpoint_params(source)
        return InitialWeights(_encoder(params), source.config, source.num_channels,
                              f"encoder of {runs.model_path(path)}", _head_classes(params))
    return InitialWeights(path, None, 3, path)


def _encoder(params: dict) -> dict:
    """The params without the classification heads (DeiT's two included; the
    parts description's "classifier" group): the run builds its own,
    zero-initialised. Everything else (class, distillation and register tokens,
    LayerScale, pre-norm, pooled norm, projection, MAP head) is the encoder the
    run starts from."""
    return {k: v for k, v in params.items() if not is_classifier(k)}


def _head_classes(params: dict) -> Optional[int]:
    kernel = params.get("head/kernel")
    return None if kernel is None else int(kernel.shape[-1])


def apply_weights(model, initial: InitialWeights) -> Optional[str]:
    """Loads the initial weights into the run's model. A head the weights do
    not provide (dropped by `_encoder`, or of another class count) keeps the
    values the task built it with (the sigmoid loss's -log(classes) bias),
    where the loader would leave zeros. Returns a sentence saying that the
    weights' head was dropped, when it was (None otherwise)."""
    vit = find_vit(model)  # the run's model may wrap it (masked patch prediction)
    heads = head_layers(vit)
    built = [[np.array(w) for w in layer.get_weights()] for layer in heads]
    if isinstance(initial.weights, Mapping):  # the head left out on purpose is not said to be missing
        load_checkpoint(vit, initial.weights, new_head=initial.dropped_head is not None)
    else:
        load_weights(vit, initial.weights)
    for layer, values in zip(heads, built):
        if all(not np.any(w) for w in layer.get_weights()):  # zeros: no head came from the checkpoint
            layer.set_weights(values)
    if initial.dropped_head is None:
        return None
    return (f"the head of the weights ({initial.dropped_head} classes) was dropped: the run's head "
            f"({vit.num_classes} classes) starts anew (fine-tuning).")



def load_adapter(path, weights: Optional[str] = None):
    """The model a LoRA run trained, built again from its adapter file
    (`<workdir>/adapter.safetensors`, or the run folder): the base it names
    (or `weights`, the same base elsewhere: a copied file, another cache),
    loaded as the run loaded it, the adapter applied, the updates merged.
    Equals the run's model.keras."""
    from keras_vit.runs.adapter import apply_adapter, read_adapter

    tensors, base, model_config = read_adapter(path)
    vit = ViT.from_config(model_config)
    apply_weights(vit, resolve_weights(weights or base))
    apply_adapter(vit, tensors)
    return merge_lora(vit)
