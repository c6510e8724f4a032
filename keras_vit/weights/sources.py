"""Where a `weights=` / `from_pretrained` source is resolved to a Checkpoint.

    source                              adapter
    "imagenet21k", "augreg-..."         official name -> hub.download -> npz
    "/path/ViT-B_16.npz"                npz (architecture from the shapes)
    "/dir" with config.json "model_type" hf (transformers save_pretrained)
    "/dir" with keras-hub config.json   kerashub (save_to_preset)
    "/dir/model.safetensors" (timm)     timm (+ its config.json if present)
    "hf:ORG/NAME[@rev]"                 huggingface_hub download -> hf
    "timm:NAME[@rev]"                   huggingface_hub download of timm/NAME -> timm
    "kerashub:PRESET"                   keras-hub's own downloader -> kerashub

Every adapter returns the same Checkpoint (config + official-layout params);
`keras_vit.model.pretrained.from_pretrained` builds the model from it (above the model
in the layering: nothing here imports it) and the one strict loader assigns.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from keras_vit.errors import UserError
from keras_vit.weights.checkpoint import Checkpoint, infer_official_config, read_json, refuse_pickle

_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# File kinds open_checkpoint reads (or refuses by name): a path ending so is a checkpoint, not a Keras model.
CHECKPOINT_SUFFIXES = (".npz", ".safetensors") + _PICKLES
NAME_PREFIXES = ("hf:", "timm:", "kerashub:")


def _split_revision(name: str):
    repo, _, revision = name.partition("@")
    return repo, (revision or None)


def open_checkpoint(source, official_variant=None, model=None, new_head: bool = False) -> Checkpoint:
    """Reads any supported checkpoint source into a Checkpoint.

    official_variant: for an official checkpoint *name* ("imagenet21k"), the
    variant to fetch (names alone do not say which file).
    model: the model it is for, when its architecture is given (weights=):
    official files are then read as that architecture instead of inferring one.
    new_head: an HF transformers base without a head is read as the model its
    family's image classifier makes of it, for a new head (a fine-tuning run:
    keras_vit.weights.hf_families.map_family).
    """
    from keras_vit.weights import hub, npz

    source = os.fspath(source)
    if source.startswith("hf:"):
        from keras_vit.weights.download import hf_directory
        from keras_vit.weights.hf import read_hf_directory

        repo, revision = _split_revision(source[3:])
        return read_hf_directory(hf_directory(repo, revision), source=source, new_head=new_head)
    if source.startswith("timm:"):
        from keras_vit.weights.download import timm_files
        from keras_vit.weights.timm import read_timm

        repo, revision = _split_revision(source[5:])
        weights, config = timm_files(repo, revision)
        return read_timm(weights, config, source=source)
    if source.startswith("kerashub:"):
        from keras_vit.weights.kerashub import read_kerashub

        return read_kerashub(source[len("kerashub:"):], source=source)
    if model is not None and official_variant is None:
        official_variant = model.config
    if source in hub.CHECKPOINTS:
        if official_variant is None:
            from keras_vit.utils import console as _console

            example = (f"'{source}:B/16', or a variant name with --weights {source}" if _console.COMMAND_LINE else
                       f"keras_vit.ViT_B16(weights={source!r}) or from_pretrained('{source}:B/16')")
            raise UserError(f"{source!r} names a family of official checkpoints; say which variant, e.g. {example}.")
        path = hub.download(hub.checkpoint_url(official_variant, source))
        return _official(npz.read_npz(path), path, model)
    if ":" in source and source.split(":", 1)[0] in hub.CHECKPOINTS:  # "augreg-imagenet21k:B/16"
        name, variant = source.split(":", 1)
        return open_checkpoint(name, official_variant=variant)
    if not os.path.exists(source):
        raise UserError(
            f"Checkpoint source {source!r} is neither an existing file nor a known checkpoint name. Pass a "
            f"local path (an official .npz, an HF transformers directory, a keras-hub preset directory, a timm "
            f"model.safetensors), 'hf:ORG/NAME', 'timm:NAME', 'kerashub:PRESET', or an official name "
            f"{list(hub.CHECKPOINTS)}."
        )
    if os.path.isdir(source):
        return _open_directory(source, new_head)
    lower = source.lower()
    if lower.endswith(_PICKLES):
        refuse_pickle(source)
    if lower.endswith(".npz"):
        return _official(npz.read_npz(source), source, model)
    if lower.endswith(".safetensors"):
        directory = os.path.dirname(os.path.abspath(source))
        from keras_vit.weights.hf import is_hf_directory, read_hf_directory

        if is_hf_directory(directory) and os.path.basename(source) == "model.safetensors":
            return read_hf_directory(directory, new_head=new_head)
        from keras_vit.weights.timm import read_timm

        config = os.path.join(directory, "config.json")
        return read_timm(source, config if os.path.isfile(config) else None, source=source)
    if lower.endswith((".keras", ".h5")):
        raise UserError(f"{source!r} is a Keras file: load it with keras.models.load_model (a whole model) "
                        f"or model.load_weights (.weights.h5), not as a checkpoint source.")
    raise UserError(f"{source!r} is not a checkpoint keras-vit reads: expected .npz, .safetensors or a directory.")


def _official(params, where, model) -> Checkpoint:
    if model is None:
        return infer_official_config(params, source=where)
    # The architecture is given: the strict loader names any difference, tensor by tensor.
    return Checkpoint(config=model.config, params=params, image_size=model.image_size, source=where,
                      num_channels=model.num_channels)


def is_checkpoint_name(text) -> bool:
    """True for a source named rather than found on disk: 'hf:', 'timm:',
    'kerashub:' and the official checkpoint names ('imagenet21k', 'imagenet21k:B/16')."""
    from keras_vit.weights import hub

    text = os.fspath(text)
    return text.startswith(NAME_PREFIXES) or text.split(":", 1)[0] in hub.CHECKPOINTS


def check_weights_exist(weights) -> None:
    """Refuses initial weights that name no checkpoint and do not exist ('dinov22', a
    mistyped folder): found where the weights are resolved, they would otherwise
    be taken for a file or "no weights" and fail later, naming something else."""
    from keras_vit.utils import console as _console, storage

    if weights is None or isinstance(weights, Mapping) or is_checkpoint_name(weights) or storage.exists(weights):
        return
    names = _console.either("keras-vit variants", "keras_vit.available_weights()")
    raise UserError(f"{_console.argument('weights', os.fspath(weights))} does not exist and names no checkpoint: give "
                    f"an official checkpoint name ({names}), an .npz, a .keras file, a training workdir, a "
                    f"checkpoint folder or hf:ORG/NAME.")


def directory_kind(directory) -> Optional[str]:
    """"hf", "kerashub" or "timm" for a checkpoint directory of that kind (by its
    config.json), "peft" for a peft adapter folder (adapter_config.json), else None."""
    from keras_vit.weights.peft import is_peft_directory

    if is_peft_directory(directory):
        return "peft"
    config_path = os.path.join(os.fspath(directory), "config.json")
    if not os.path.isfile(config_path):
        return None
    config = read_json(config_path)
    if "model_type" in config:
        return "hf"
    if "keras_hub" in str(config.get("module", "")) or "keras_hub" in str(config.get("registered_name", "")):
        return "kerashub"
    if "architecture" in config:
        return "timm"
    return None


def _open_directory(directory, new_head: bool = False) -> Checkpoint:
    kind = directory_kind(directory)
    if kind == "peft":  # a peft LoRA adapter: its base, with the adapter merged
        from keras_vit.weights.peft import read_peft_directory

        return read_peft_directory(directory, new_head=new_head)
    if kind == "hf":
        from keras_vit.weights.hf import read_hf_directory

        return read_hf_directory(directory, new_head=new_head)
    if kind == "kerashub":
        from keras_vit.weights.kerashub import read_kerashub

        return read_kerashub(directory, source=directory)
    if kind == "timm":
        from keras_vit.weights.timm import read_timm

        return read_timm(os.path.join(directory, "model.safetensors"), os.path.join(directory, "config.json"),
                         source=directory)
    for name in ("pytorch_model.bin", "model.pt", "model.pth"):
        if os.path.isfile(os.path.join(directory, name)):
            refuse_pickle(os.path.join(directory, name))
    if os.path.isfile(os.path.join(directory, "config.json")):  # there, but naming no kind: damaged or foreign
        raise UserError(
            f"{directory!r} has a config.json without model_type (HF transformers), 'architecture' (timm) or a "
            f"keras_hub class (keras-hub): if it is a checkpoint, its config.json is damaged; restore it.")
    raise UserError(
        f"{directory!r} is not a checkpoint directory keras-vit recognises: expected an HF transformers ViT "
        f"(config.json with model_type + model.safetensors), a keras-hub preset (config.json + "
        f"model.weights.h5) or a timm model (config.json with 'architecture' + model.safetensors)."
    )


def load_source(model, source) -> None:
    """`weights=` of the constructors: any source, into a model whose architecture is given.
    The strict loader checks every tensor against it; a foreign source must also have the
    model's numerics (GELU form, LayerNorm eps), or the model would not reproduce it."""
    from keras_vit.weights.npz import load_checkpoint

    checkpoint = open_checkpoint(source, model=model)
    mine, theirs = model.config, checkpoint.config
    if (mine.gelu_approximate, mine.layer_norm_epsilon) != (theirs.gelu_approximate, theirs.layer_norm_epsilon):
        raise UserError(
            f"{checkpoint.source} was trained with {_numerics(theirs)}, but the model uses {_numerics(mine)}, "
            f"so it would not reproduce the checkpoint's outputs. Build it with "
            f"gelu_approximate={theirs.gelu_approximate}, layer_norm_epsilon={theirs.layer_norm_epsilon!r}, or use "
            f"keras_vit.from_pretrained({source!r}), which reads them from the checkpoint."
        )
    load_checkpoint(model, checkpoint.params)
    if model.include_top and model.num_classes == checkpoint.num_classes:
        model.labels = checkpoint.labels


def _numerics(config) -> str:
    gelu = "tanh GELU" if config.gelu_approximate else "exact GELU"
    return f"{gelu} and LayerNorm eps {config.layer_norm_epsilon:g}"


def load_weights(model, weights) -> None:
    """Loads `weights` into `model`: a params dict in the official layout, or any
    source keras_vit.from_pretrained reads: a path to an official-format `.npz`,
    an official checkpoint name (see keras_vit.available_weights), an HF /
    keras-hub / timm directory or file, "hf:ORG/NAME", "timm:NAME",
    "kerashub:PRESET". Every source ends in load_checkpoint."""
    from keras_vit.weights.npz import load_checkpoint

    if isinstance(weights, Mapping):
        return load_checkpoint(model, weights)
    load_source(model, weights)
