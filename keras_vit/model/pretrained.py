"""`from_pretrained`: a ViT built from a checkpoint's own config, its weights loaded.

Above both the model and the weights in the layering (docs/architecture.md):
`keras_vit.weights` reads checkpoints into a model it is given (the
`weights=` of the constructors), and this module builds the model, so neither
of those imports the other's caller.
"""

from __future__ import annotations

from keras_vit.errors import UserError
from keras_vit.model import ViT
from keras_vit.weights.npz import load_checkpoint
from keras_vit.weights.sources import open_checkpoint

_MODEL_ARGS = ("image_size", "num_classes", "include_top", "include_preprocessing", "classifier_activation",
               "num_channels", "name", "trainable", "dtype", "dynamic_image_size", "dynamic_image_pad")


def from_pretrained(source, **overrides):
    """A keras_vit.ViT built from a checkpoint's own config, its weights loaded.

    Args:
        source: any checkpoint source (see keras_vit.weights.sources).

    Keyword Args:
        image_size: another input size; the position embedding is resized.
        num_classes: a new zero-initialised head of that many classes (the
            checkpoint's head is kept when this is omitted or equal). On an HF
            transformers base it reads what that family's image classifier
            reads, as `*ForImageClassification.from_pretrained(base,
            num_labels=K)` does (DINOv2's class token beside the patch mean,
            SigLIP's and CLIP's means, no ViT pooler; keras_vit.weights.hf_families).
        include_top: False drops the head.
        dynamic_image_size: one model for any size (multiples of the patch
            size); the position embedding, loaded for `image_size`, is
            interpolated in the graph for other grids. dynamic_image_pad=True
            also takes sizes that are not multiples (padded).
        patch_size: another patch size (a ViTConfig field): the patch
            kernel is resized by FlexiViT's pseudo-inverse rule and the
            position embedding to the new grid (keras_vit.weights.patch_resize).
        **overrides: other ViT arguments (include_preprocessing, ...) and
            ViTConfig fields (dropout_rate, ...).

    The checkpoint's class names, when it has them, are kept as `model.labels`.
    """
    new_head = overrides.get("num_classes") is not None and overrides.get("include_top", True) is not False
    checkpoint = open_checkpoint(source, new_head=new_head)
    overrides_given = set(overrides)
    model_args = {k: overrides.pop(k) for k in _MODEL_ARGS if k in overrides}
    config = checkpoint.config.replace(**overrides) if overrides else checkpoint.config
    model_args.setdefault("image_size", checkpoint.image_size)
    if checkpoint.dynamic_image_size and "image_size" not in overrides_given:
        # NaFlex (SigLIP2): every image at its own grid, the table resized from the checkpoint's own.
        model_args.setdefault("dynamic_image_size", True)
    model_args.setdefault("num_channels", checkpoint.num_channels)
    head = checkpoint.num_classes
    if "num_classes" in model_args and model_args["num_classes"] is not None:
        model_args.setdefault("include_top", True)
    elif model_args.get("include_top", head is not None):
        if head is None:
            raise UserError(f"{checkpoint.source} has no classification head: pass num_classes=N for a new "
                            f"zero head, or include_top=False for the features.")
        model_args["num_classes"] = head
        model_args.setdefault("include_top", True)
    else:
        model_args["include_top"] = False
    model = ViT(config, **model_args)
    load_checkpoint(model, checkpoint.params)
    if model.include_top and model.num_classes == head:
        model.labels = checkpoint.labels
    return model
