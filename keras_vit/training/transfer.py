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
    (a name, a path, or a params dict), or a quantised ViT (copied variable by
    variable), and, for a Keras source, its architecture."""

    weights: Union[str, dict, ViT]
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


def resolve_weights(weights: Optional[str], new_head: bool = False) -> Optional[InitialWeights]:
    """What `weights` resolve to; new_head: for a classifier, an HF transformers base without a
    head is read as its family's image classifier (keras_vit.weights.sources.open_checkpoint)."""
    if weights is None:
        return None
    check_weights_exist(weights)  # before anything else: a mistyped name would be taken for a path
    path = os.fspath(weights)
    if path.startswith(NAME_PREFIXES) or (model_source.is_checkpoint(path) and os.path.isdir(path)):
        # An HF transformers, keras-hub or timm folder or hub name ("hf:ORG/NAME"), as predict/export
        # take it: its architecture too.
        checkpoint = open_checkpoint(path, new_head=new_head)
        return InitialWeights(_encoder(checkpoint.params), checkpoint.config, checkpoint.num_channels, f"checkpoint {path}",
                              _head_classes(checkpoint.params))
    if storage.isdir(path) or path.endswith(".keras"):
        try:
            source = merge_lora(find_vit(runs.load_model(path)))  # an unmerged LoRA model: its function
        except runs.ModelFileError as error:
            raise UserError(f"{_console.either('--weights', 'weights')}: {error}") from None
        if source.config.quantization:  # QLoRA's base: its integer weights go across as they are
            return InitialWeights(source, source.config, source.num_channels,
                                  f"{source.config.quantization} encoder of {runs.model_path(path)}",
                                  source.num_classes if source.include_top else None)
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


def apply_weights(model, initial: InitialWeights, head_given: bool = False) -> Optional[str]:
    """Loads the initial weights into the run's model. A head the weights do
    not provide (dropped by `_encoder`, or of another class count) keeps the
    values the task built it with (the sigmoid loss's -log(classes) bias),
    where the loader would leave zeros. Returns a sentence saying that the
    weights' head was dropped, when it was (None otherwise). head_given: the head comes from
    elsewhere (an adapter file), so weights without one are not said to lack it."""
    vit = find_vit(model)  # the run's model may wrap it (masked patch prediction)
    heads = head_layers(vit)
    built = [[np.array(w) for w in layer.get_weights()] for layer in heads]
    if isinstance(initial.weights, ViT):
        _copy_quantized(vit, initial.weights)
    elif isinstance(initial.weights, Mapping):  # the head left out on purpose is not said to be missing
        load_checkpoint(vit, initial.weights, new_head=head_given or initial.dropped_head is not None)
    else:
        load_weights(vit, initial.weights)
    for layer, values in zip(heads, built):
        if all(not np.any(w) for w in layer.get_weights()):  # zeros: no head came from the checkpoint
            layer.set_weights(values)
    if initial.dropped_head is None:
        return None
    if vit is not model and not vit.include_top:  # a Task's own head on the ViT's tokens
        return (f"the head of the weights ({initial.dropped_head} classes) was dropped: the run's model has a head "
                f"of its own ({model.name}), which starts anew.")
    return (f"the head of the weights ({initial.dropped_head} classes) was dropped: the run's head "
            f"({vit.num_classes} classes) starts anew (fine-tuning).")



def _copy_quantized(vit, source) -> None:
    """A quantised ViT's weights into the run's (quantised, LoRA) model, variable by
    variable: the integer kernels with their scales, everything float; not the heads
    (the run's own) nor the LoRA updates (which start as built). The source is
    resized to the run's image size first (its integers kept: ViT.with_image_size)."""
    from keras_vit.weights.layout import is_lora_key, variables_by_key

    source = source.with_image_size(vit.image_size, dynamic_image_size=vit.dynamic_image_size,
                                    dynamic_image_pad=vit.dynamic_image_pad)
    own = {variable.path for key, variable in variables_by_key(vit).items() if is_lora_key(key) or is_classifier(key)}
    values = {variable.path: variable for variable in source.weights}
    for variable in vit.weights:
        if variable.path in own:
            continue
        value = values.get(variable.path)
        if value is None or tuple(value.shape) != tuple(variable.shape):  # the same config built both
            raise AssertionError(f"{variable.path}: not in the quantised source as {tuple(variable.shape)}")
        variable.assign(value)


def load_adapter(path, weights: Optional[str] = None):
    """The model a LoRA run trained, built again from its adapter file
    (`<workdir>/adapter.safetensors`, or the run folder): the base it names
    (or `weights`, the same base elsewhere: a copied file, another cache),
    loaded as the run loaded it, the adapter applied, the updates merged.
    Equals the run's model.keras."""
    from keras_vit.runs.adapter import apply_adapter, read_adapter

    tensors, base, model_config = read_adapter(path)
    vit = ViT.from_config(model_config)
    initial = resolve_weights(weights or base, new_head=vit.include_top)
    if initial.source_config is not None and _pooling(initial.source_config) != _pooling(vit.config):
        initial = resolve_weights(weights or base)  # a run that read its base as it is (from before new_head)
    apply_weights(vit, initial, head_given=True)
    apply_adapter(vit, tensors)
    return merge_lora(vit)


def _pooling(config: ViTConfig) -> tuple:
    """What a classifier on an encoder reads (hf_families' new_head form changes these alone: a
    bare ViTModel's pooler, the representation layer, too)."""
    return (config.classifier, config.final_norm, config.projection_size, config.has_class_token,
            config.representation_size)
