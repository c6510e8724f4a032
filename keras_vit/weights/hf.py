"""HF transformers directories (config.json + model.safetensors), both ways.

Reading: config.json's model_type picks the family's adapter
(keras_vit.weights.hf_families: ViT, DeiT, DINOv2, SigLIP, CLIP); ViT's own
normalisation is its preprocessor_config.json's. Writing: a ViT as HF's
`ViTForImageClassification` (or a bare `ViTModel`), its tensors named by the
ViT adapter's table read backwards, so the reader and the writer cannot
disagree. The on-disk names are the ones `save_pretrained` writes
(transformers 5 still writes its 4.x names).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import numpy as np

from keras_vit.utils import console as _console, storage
from keras_vit.config import PROJECTIONS, ViTConfig
from keras_vit.errors import UserError
from keras_vit.images import NORMALIZATIONS, pixel_normalization
from keras_vit.weights.checkpoint import (
    Checkpoint,
    read_json,
    read_safetensors,
    refuse_pickle,
    unrename,
    write_safetensors,
)
from keras_vit.weights.hf_families import map_family, vit_table
from keras_vit.weights.layout import official_layout_error


def is_hf_directory(path) -> bool:
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return False
    try:
        return "model_type" in read_json(config)
    except ValueError:
        return False


def read_hf_directory(directory, source: Optional[str] = None,
                      tensors: Optional[Dict[str, np.ndarray]] = None, new_head: bool = False) -> Checkpoint:
    """An HF transformers ViT (or DeiT, DINOv2, SigLIP, CLIP) directory as a
    Checkpoint; `tensors`: the directory's own tensors changed (a peft adapter
    merged into them, keras_vit.weights.peft), read from it when None; new_head:
    a base without a head read as its family's image classifier would read it
    (hf_families.map_family), for a new head."""
    directory = os.fspath(directory)
    where = source or directory
    if tensors is None:
        tensors = read_hf_tensors(directory, where)
    mapped = map_family(read_json(os.path.join(directory, "config.json")), tensors, where, new_head)
    fields = dict(mapped.fields)
    if "pixel_normalization" not in fields:  # a family's weights fix theirs; ViT's preprocessor says
        normalization = processor_normalization(directory, where)
        if normalization is not None:
            fields["pixel_normalization"] = normalization
    return Checkpoint(config=ViTConfig(**fields), params=mapped.params, image_size=mapped.image_size,
                      labels=mapped.labels, source=where, num_channels=mapped.num_channels,
                      dynamic_image_size=mapped.dynamic_image_size)


def read_hf_tensors(directory, where) -> Dict[str, np.ndarray]:
    """{on-disk name: array} of an HF directory's model.safetensors (never a pickle)."""
    weights = os.path.join(directory, "model.safetensors")
    if not os.path.isfile(weights):
        if os.path.isfile(os.path.join(directory, "model.safetensors.index.json")):
            raise UserError(f"{where} holds a sharded checkpoint (model.safetensors.index.json); keras-vit reads "
                            f"single-file model.safetensors only: re-save it with "
                            f"save_pretrained(DIR, max_shard_size='20GB').")
        for name in ("pytorch_model.bin", "model.pt", "model.pth"):
            if os.path.isfile(os.path.join(directory, name)):
                refuse_pickle(os.path.join(directory, name))
        raise UserError(f"{where} has no model.safetensors next to its config.json.")
    return read_safetensors(weights)


def processor_normalization(directory, where) -> Optional[str]:
    """The ViTConfig.pixel_normalization a directory's preprocessor_config.json
    names by its image_mean/image_std (ViT repos hold DeiT's ImageNet-normalised
    weights too), or None without one; another mean/std is a warning."""
    from keras_vit.images import NORMALIZATIONS

    path = os.path.join(directory, "preprocessor_config.json")
    if not os.path.isfile(path):
        return None
    processor = read_json(path)
    mean, std = processor.get("image_mean"), processor.get("image_std")
    if mean is None or std is None or not processor.get("do_normalize", True):
        return None
    for name, (want_mean, want_std) in NORMALIZATIONS.items():
        if np.allclose(np.asarray(mean) * 255, want_mean, atol=0.01) and \
                np.allclose(np.asarray(std) * 255, want_std, atol=0.01):
            return name
    _console.warn(f"{where} normalises images with mean {mean} and std {std}, which keras-vit does not name: "
                  f"normalise them that way yourself.")
    return None


# --- writing ---

def _family_problems(config: ViTConfig) -> List[str]:
    """What a model read from DeiT, DINOv2, SigLIP, AIMv2 or CLIP has that HF's ViT does not compute."""
    problems = []
    if config.distillation_token:
        problems.append("it has DeiT's distillation token")
    if config.num_register_tokens:
        problems.append(f"it has {config.num_register_tokens} register tokens")
    if config.layer_scale_init is not None:
        problems.append("its blocks have LayerScale")
    if config.mlp_activation != "gelu":
        problems.append(f"its MLP is {config.mlp_activation!r}")
    if config.pre_norm:
        problems.append("it normalises the tokens before the encoder (pre_norm)")
    if not config.patch_bias:
        problems.append("its patch embedding has no bias")
    if config.final_norm != "tokens":
        problems.append(f"its final LayerNorm is on the {config.final_norm} vector")
    if config.projection_size:
        problems.append("it ends in a projection (projection_size)")
    if config.norm != "layer_norm":
        problems.append(f"its norms are {config.norm!r}")
    if config.patch_norm:
        problems.append("it normalises the patch embedding (patch_norm)")
    if config.projection_biases != PROJECTIONS:
        missing = sorted(set(PROJECTIONS) - set(config.projection_biases))
        problems.append(f"its {', '.join(missing)} projections have no bias")
    return problems


def hf_config(model, labels: Optional[List[str]] = None) -> dict:
    """The config.json of `model` as an HF ViT (ViTForImageClassification, or ViTModel without a head)."""
    config: ViTConfig = model.config
    position_problem = official_layout_error(model, "HF transformers' ViT")
    if position_problem:  # its own fix (.keras), whatever else HF could not express
        raise UserError(position_problem)
    problems = []
    if config.resnet is not None:
        problems.append("it is a hybrid (HF transformers 5 has no ViT-hybrid)")
    if config.classifier != "token":
        problems.append(f"it pools with classifier={config.classifier!r} (HF's ViT reads the class token)")
    problems += _family_problems(config)
    if model.include_top and config.representation_size:
        problems.append("it has a representation layer before its head (HF's classifier reads the "
                        "class token directly); save it with include_top=False, or fine-tune without "
                        "representation_size")
    if model.image_size[0] != model.image_size[1]:
        problems.append(f"its images are not square ({model.image_size})")
    if problems:
        raise UserError(f"{model.name} cannot be written as an HF transformers ViT: " + "; ".join(problems) + ".")
    out = {
        "architectures": ["ViTForImageClassification" if model.include_top else "ViTModel"],
        "model_type": "vit",
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "gelu_pytorch_tanh" if config.gelu_approximate else "gelu",
        "layer_norm_eps": config.layer_norm_epsilon,
        "hidden_dropout_prob": config.dropout_rate,
        "attention_probs_dropout_prob": config.attention_dropout_rate,
        "image_size": model.image_size[0],
        "patch_size": config.patch_size,
        "num_channels": model.num_channels,
        "qkv_bias": True,
        "encoder_stride": config.patch_size,
        "initializer_range": 0.02,
        "pooler_act": "tanh",
        "pooler_output_size": config.representation_size or config.hidden_size,
        "dtype": "float32",
    }
    if model.include_top:
        if labels is not None and len(labels) != model.num_classes:
            raise UserError(f"labels has {len(labels)} names for a head of {model.num_classes} classes.")
        names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(model.num_classes)]
        out["id2label"] = {str(i): str(name) for i, name in enumerate(names)}
        out["label2id"] = {str(name): i for i, name in enumerate(names)}
        if getattr(model, "output_activation", None) == "sigmoid":  # multi-label: HF's pipelines then use sigmoid
            out["problem_type"] = "multi_label_classification"
    return out


def hf_tensors(model) -> Dict[str, np.ndarray]:
    """The model's weights under HF ViT names: the ViT adapter's rules, read backwards."""
    from keras_vit.weights.npz import checkpoint_params

    prefix = "vit." if model.include_top else ""
    return unrename(checkpoint_params(model), vit_table(prefix, model.config.num_layers, model.config.num_heads))


def save_pretrained(model, directory, labels: Optional[List[str]] = None) -> str:
    """Writes `model` as an HF transformers ViT directory (config.json,
    model.safetensors, preprocessor_config.json) that
    `transformers.ViTForImageClassification.from_pretrained` (or `ViTModel`
    for include_top=False) loads with the same outputs (logits: HF applies
    no classifier_activation). The directory is written beside its place and
    swapped in whole (`storage.writing_directory`), so a failure leaves the
    previous one intact and readers never see a mix of two saves."""
    directory = storage.abspath(directory)
    labels = labels if labels is not None else getattr(model, "labels", None)
    config = hf_config(model, labels)  # refuses what HF cannot express, before writing anything
    tensors = hf_tensors(model)
    # The normalisation its weights expect ([-1, 1] unless read from ImageNet- or CLIP-normalised weights).
    mean, std = ([round(v / 255, 8) for v in values] for values in NORMALIZATIONS[pixel_normalization(model)])
    preprocessor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True, "size": {"height": model.image_size[0], "width": model.image_size[1]},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": mean, "image_std": std, "resample": 2,
    }
    _refuse_others(directory)
    with storage.writing_directory(directory) as folder:
        write_safetensors(tensors, os.path.join(folder, "model.safetensors"))
        for name, content in (("config.json", config), ("preprocessor_config.json", preprocessor)):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2)
    return directory


_SAVED_FILES = ("config.json", "model.safetensors", "preprocessor_config.json")


def _refuse_others(directory: str) -> None:
    """The whole directory is replaced: refuses to drop files that an earlier save did not write."""
    if not storage.isdir(directory):
        return
    others = sorted(set(storage.listdir(directory)) - set(_SAVED_FILES))
    if others:
        raise UserError(f"save_pretrained replaces the whole directory {directory}, which also holds "
                        f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}: save to a new or empty "
                        f"directory, or remove those first.")
