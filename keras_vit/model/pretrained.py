"""`from_pretrained`: a ViT built from a checkpoint's own config, its weights loaded.

Above both the model and the weights in the layering (docs/architecture.md):
`keras_vit.weights` reads checkpoints into a model it is given (the
`weights=` of the constructors), and this module builds the model, so neither
of those imports the other's caller.
"""

from __future__ import annotations

import os

from keras_vit.errors import UserError
from keras_vit.model import ViT
from keras_vit.weights.npz import load_checkpoint
from keras_vit.weights.sources import open_checkpoint

_MODEL_ARGS = ("image_size", "num_classes", "include_top", "include_preprocessing", "classifier_activation",
               "num_channels", "name", "trainable", "dtype", "dynamic_image_size", "dynamic_image_pad")


def from_pretrained(source, task=None, **overrides):
    """A keras_vit.ViT built from a checkpoint's own config, its weights loaded.

    Args:
        source: any checkpoint source (see keras_vit.weights.sources).
        task: None (an image model), or "image_text": both towers of a SigLIP, SigLIP2, CLIP
            or MetaCLIP 2 checkpoint (transformers' *Model, with its tokenizer files beside
            it) as a keras_vit.model.image_text.ImageTextModel, which tokenizes, embeds
            images and texts, and classifies zero-shot.

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
    if task == "image_text":
        return _image_text(source, **overrides)
    if task is not None:
        raise UserError(f"from_pretrained(task={task!r}): give task='image_text' for both towers of an "
                        f"image-text checkpoint, or leave task out for an image model.")
    new_head = overrides.get("num_classes") is not None and overrides.get("include_top", True) is not False
    return _image_model(open_checkpoint(source, new_head=new_head), overrides)


def _image_model(checkpoint, overrides):
    """The ViT of a Checkpoint, from_pretrained's overrides applied."""
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


def _image_text(source, **overrides):
    """from_pretrained(source, task="image_text"): both towers, the logit scale and the tokenizer."""
    from keras_vit.model.image_text import ImageTextModel
    from keras_vit.text.tokenizer import read_tokenizer
    from keras_vit.weights.checkpoint import read_json
    from keras_vit.weights.hf import read_hf_directory, read_hf_tensors
    from keras_vit.weights.hf_text import load_text_params, read_text_half

    saved = _saved_image_text(source)
    if saved is not None:  # a training run of the image-text Task, or its model.keras
        return saved
    directory, where = _image_text_directory(source)
    hf = read_json(os.path.join(directory, "config.json"))
    tensors = read_hf_tensors(directory, where)
    text = read_text_half(hf, tensors, where)  # first: it names a single tower or another model
    tokenizer = read_tokenizer(directory, text.model_type, text.config.max_positions, where, text.pad_token_id)
    for key in ("include_top", "num_classes"):
        if overrides.get(key):
            raise UserError(f"from_pretrained(task='image_text') has no classification head ({key}=...): it "
                            f"classifies with texts (zero_shot); leave {key} out.")
    overrides = dict(overrides, include_top=False)
    image_tower = _image_model(read_hf_directory(directory, source=where, tensors=tensors), overrides)
    model = ImageTextModel(image_tower, text.config, loss=text.loss, uses_token_mask=tokenizer.returns_mask,
                           family=text.family, tokenizer=tokenizer, name=f"{text.model_type}_image_text")
    load_text_params(model.text_tower, text.params, where)
    model.logit_scale.assign(text.logit_scale)
    if model.logit_bias is not None:
        model.logit_bias.assign(text.logit_bias)
    model.source, model.directory = where, directory
    return model


def _saved_image_text(source):
    """The ImageTextModel of a run folder or .keras file (its tokenizer inside it), else None."""
    from keras_vit import runs
    from keras_vit.model.image_text import ImageTextModel

    path = os.fspath(source)
    if not (path.endswith(".keras") or os.path.isfile(os.path.join(path, "model.keras"))):
        return None
    model = runs.load_model(path)
    if not isinstance(model, ImageTextModel):
        raise UserError(f"{path} holds a {type(model).__name__}, not an image-text model: image-text commands "
                        f"read a run of --recipe siglip or clip, or a transformers image-text folder.")
    model.source, model.directory = path, None
    return model


def _image_text_directory(source):
    """(local folder, the name to report) of an image-text source: a folder or an hf: name."""
    from keras_vit.weights.hf import is_hf_directory

    source = os.fspath(source)
    if source.startswith("hf:"):
        from keras_vit.weights.download import TOKENIZER_FILES, hf_directory
        from keras_vit.weights.sources import _split_revision

        repo, revision = _split_revision(source[3:])
        return hf_directory(repo, revision, also=TOKENIZER_FILES), source
    if not os.path.isdir(source) or not is_hf_directory(source):
        raise UserError(f"{source!r} is not an HF transformers folder (config.json with model_type, "
                        f"model.safetensors, tokenizer files): image-text models load from a folder that "
                        f"SiglipModel/CLIPModel.save_pretrained and its processor wrote, or an 'hf:ORG/NAME'.")
    return source, source
