"""What to export: a model, anything keras_vit.runs.source opens, or a variant + weights.

Resolves to the Keras model, its class labels and a name for the artifacts.
"""

from __future__ import annotations

import dataclasses
import os
import re

import keras

from keras_vit.errors import UserError


def resolve(model_or_path, *, weights=None, image_size=None, num_classes=None, num_channels=None,
            labels=None, name=None, dynamic_image_size=False):
    """The model to export, its labels and a name: a keras_vit.runs.source.ModelSource
    whose labels are always given ("0".."N-1" where none are known) and whose name is
    safe as a file name.

    Args:
        model_or_path: a keras.Model; anything keras_vit.runs.source opens
            (a run folder or `.keras` file, local or on any filesystem
            keras_vit.utils.storage reaches; a checkpoint folder, file or name that
            from_pretrained takes); or a variant name ("B/16") built with
            `weights`, `image_size`, `num_classes`, `num_channels`.
        labels: a list of class names or a path to a file with one per line;
            default: the model's own, else its workdir's, else "0".."N-1".
        name: the artifacts' name; default from the file, folder, checkpoint or variant.
        image_size: for a variant, the size it is built at; for any other
            ViT, the size it is rebuilt at (position weights resized), the
            size of every fixed-size artifact. An int or (height, width).
        dynamic_image_size: export a ViT that takes any size
            (ViT.with_image_size); validated at its image_size.
    """
    from keras_vit import runs
    from keras_vit.runs import source as model_source
    from keras_vit.utils import storage
    from keras_vit.variants import VARIANTS, canonical_name
    from keras_vit.weights.sources import is_checkpoint_name

    variant = False
    if isinstance(model_or_path, keras.Model):
        model = model_or_path
        opened = model_source.ModelSource(model, model_source.choose_labels(model, labels), model.name,
                                          f"in-memory model {model.name!r}")
    else:
        path = os.fspath(model_or_path)
        # Registered variant names ("B/16") contain "/": they are looked up
        # before the path, unless a file or folder of that name exists.
        variant = not storage.exists(path) and _variant_name(path, VARIANTS, canonical_name)
        if not variant and (storage.exists(path) or path.endswith(".keras") or os.path.sep in path
                            or storage.is_remote(path) or is_checkpoint_name(path)):
            opened = model_source.open_model(path, labels)
        else:  # a variant, or a name that is nothing: _from_variant says so
            model = _from_variant(path, weights, image_size, num_classes, num_channels)
            opened = model_source.ModelSource(model, model_source.choose_labels(model, labels), model.name,
                                              f"variant {path} with weights {weights}")
    opened = model_source.resized(opened, None if variant else image_size, dynamic_image_size)
    _check_model(opened.model)
    num_outputs = int(opened.model.outputs[0].shape[-1])
    names = runs.default_labels(num_outputs) if opened.labels is None else opened.labels
    return dataclasses.replace(opened, labels=names, name=_safe_name(name or opened.name))


def _variant_name(text, variants, canonical_name):
    try:
        return canonical_name(text) in variants
    except UserError:  # not a variant's name: a path or a checkpoint name, perhaps
        return False


def _from_variant(variant, weights, image_size, num_classes, num_channels):
    from keras_vit import ViT, get_variant

    try:
        get_variant(variant)
    except UserError as error:
        raise UserError(f"{variant!r} is neither a model file, a workdir nor a variant, nor a checkpoint "
                                f"name ('hf:ORG/NAME', 'kerashub:PRESET', 'imagenet21k:B/16', ...). {error}") from None
    if weights is None:
        raise UserError(f"Exporting variant {variant!r} needs weights (an .npz path or a checkpoint name): "
                         f"an export of random weights is of no use.")
    return ViT(variant, image_size=image_size or 224, num_classes=num_classes or 1000, weights=weights,
               num_channels=num_channels or 3)


def _check_model(model):
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UserError(f"Export needs a model with one image input and one output; {model.name} has "
                         f"{len(model.inputs)} inputs and {len(model.outputs)} outputs.")
    shape = tuple(model.inputs[0].shape)
    any_size = getattr(model, "dynamic_image_size", False) and shape[3] is not None
    if len(shape) != 4 or (any(d is None for d in shape[1:]) and not any_size):
        raise UserError(f"Export needs a fixed input size (batch, height, width, channels); {model.name} takes "
                         f"{shape}.")
    if getattr(model, "include_top", True) is False:
        from keras_vit.runs.source import no_head_error

        raise no_head_error("export")
    if len(model.outputs[0].shape) != 2:
        raise UserError(f"Export needs class scores (batch, classes); {model.name} returns "
                         f"{tuple(model.outputs[0].shape)}.")


def _safe_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"
    return safe
