"""Walking a built model: the ViTs in it, their encoder blocks and weights' parts, and
the switches applied to every block (rematerialisation, the fused GELU)."""

from __future__ import annotations

import keras

from keras_vit.weights import parts as weight_parts
from keras_vit.model.description import activation_name
from keras_vit.model.vit import ViT


def rematerialize_blocks(model, enabled: bool = True) -> int:
    """Makes every encoder block of `model` keep only its input for the
    backward pass and recompute the rest there (EncoderBlock.rematerialize):
    activation memory of the encoder falls from all blocks' internals to one
    block's, for about one more forward pass per step. Returns the number of
    blocks. Outputs and gradients are unchanged (dropout masks included)."""
    blocks = encoder_blocks(model)
    for block in blocks:
        block.rematerialize = bool(enabled)
    return len(blocks)


def fuse_gelu(model, enabled: bool = True) -> int:
    """Makes every MLP block of `model` take the fused GELU kernel when
    training on TensorFlow (MlpBlock.fused_gelu, keras_vit.layers.fused):
    for steps that are not XLA-compiled. Returns the number of MLP blocks.
    Outputs and gradients are unchanged up to float32 rounding."""
    mlps = [block.mlp for block in encoder_blocks(model)]
    for mlp in mlps:
        mlp.fused_gelu = bool(enabled)
    return len(mlps)


def encoder_blocks(model) -> list:
    """Every EncoderBlock of the ViTs in `model` (the model itself, or ViTs
    nested in it as layers, e.g. a task's wrapper), in order, from each
    encoder's own list of its blocks: no walk through Keras' private layer
    tracking."""
    return [block for vit in vits_in(model) for block in vit.encoder.blocks]


def vits_in(model, seen=None) -> list:
    """The ViTs in `model`: the model itself, or every ViT nested in it as a
    layer (a task's wrapper, e.g. masked patch prediction), in layer order."""
    seen = set() if seen is None else seen
    if id(model) in seen:
        return []
    seen.add(id(model))
    if isinstance(model, ViT):
        return [model]
    # keras.Model.layers (public) lists a model's direct sub-layers, subclassed models' included.
    return [vit for layer in getattr(model, "layers", ()) for vit in vits_in(layer, seen)]


def text_towers_in(model) -> list:
    """The text towers of an image-text model in `model` (keras_vit.model.text_tower); [] for any other."""
    tower = getattr(model, "text_tower", None)
    return [tower] if tower is not None else []


def weight_parts_of(model) -> dict:
    """{variable path: keras_vit.weights.parts.WeightPart} for every weight of
    every ViT in `model` and of an image-text model's text tower; a wrapper's own
    layers (a task's head, the logit scale) are not listed."""
    parts = {path: part for vit in vits_in(model) for path, part in weight_parts.weight_parts(vit).items()}
    for tower in text_towers_in(model):
        parts.update(weight_parts.text_weight_parts(tower))
    return parts


def output_activation(model):
    """`model.output_activation` for a ViT; for any other Keras model, that
    of its last layer (a Dense with an activation, an Activation or Softmax
    layer): "softmax", "sigmoid" or None (logits)."""
    if isinstance(model, ViT):
        return model.output_activation
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if isinstance(last, (keras.layers.Softmax, keras.layers.Activation)):
        return activation_name(last)
    return activation_name(getattr(last, "activation", None))


def returns_probabilities(model) -> bool:
    """True when `model`'s outputs are probabilities already (its head ends in
    softmax or sigmoid: `output_activation`); False for logits."""
    return output_activation(model) is not None
