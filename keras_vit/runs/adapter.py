"""A LoRA run's adapter file: what the run trained, apart from the weights it started from.

`<workdir>/adapter.safetensors` holds the low-rank updates' factors and the
head under the key table's names (".../query/lora_a", "head/kernel"), and in
its metadata the base it adapts (the run's --weights, as given) and the
model's config, LoRA included. keras_vit.training.load_adapter builds the
base again, applies the file and merges it: the run's model.keras.
safetensors holds arrays only: reading one runs no code.
"""

from __future__ import annotations

import json
from typing import NamedTuple, Optional, Tuple

import numpy as np

from keras_vit.errors import UserError
from keras_vit.utils import storage

ADAPTER_FILE = "adapter.safetensors"
FORMAT = "keras_vit.lora/1"


def write_adapter(workdir, vit, base: str) -> str:
    """Writes `vit`'s LoRA updates and head (keras_vit.model.lora.adapter_params)
    to `<workdir>/adapter.safetensors`, atomically; returns its path."""
    from safetensors.numpy import save

    from keras_vit.model.lora import adapter_params

    tensors = {key: np.ascontiguousarray(value, np.float32) for key, value in adapter_params(vit).items()}
    metadata = {"format": FORMAT, "base": str(base), "model": json.dumps(vit.get_config())}
    path = storage.join(workdir, ADAPTER_FILE)
    storage.write_bytes(path, save(tensors, metadata=metadata))
    return path


def read_adapter(path):
    """(tensors {key: array}, base, the ViT's config) of an adapter file (or of
    the run folder holding one)."""
    from safetensors.numpy import load

    if storage.isdir(path):
        path = storage.join(path, ADAPTER_FILE)
    if not storage.isfile(path):
        raise UserError(f"No LoRA adapter at {path}: a run trained with --lora-rank writes "
                        f"WORKDIR/{ADAPTER_FILE}; give that file or its run folder.")
    content = storage.read_bytes(path)
    metadata = _metadata(content)
    if metadata.get("format") != FORMAT:
        raise UserError(f"{path} is not a keras_vit LoRA adapter (its metadata says format "
                        f"{metadata.get('format')!r}, not {FORMAT!r}).")
    return load(content), metadata["base"], json.loads(metadata["model"])


def _metadata(content: bytes) -> dict:
    """The safetensors header's "__metadata__" (the format: an 8-byte length, then JSON)."""
    size = int.from_bytes(content[:8], "little")
    return json.loads(content[8:8 + size]).get("__metadata__", {})


def apply_adapter(vit, tensors: dict) -> None:
    """Assigns an adapter's tensors to the ViT built with its config (LoRA
    included), over the base weights already loaded; each key and shape is checked."""
    from keras_vit.model.lora import adapter_params
    from keras_vit.weights.layout import variables_by_key

    variables = variables_by_key(vit)
    unknown = sorted(set(tensors) - set(variables))
    missing = sorted(set(adapter_params(vit)) - set(tensors))  # every update and the head, or it is not this run's
    wrong = [f"{key}: adapter {tuple(value.shape)}, model {tuple(variables[key].shape)}"
             for key, value in tensors.items() if key in variables and tuple(value.shape) != tuple(variables[key].shape)]
    if unknown or missing or wrong:
        raise UserError(f"The adapter does not fit {vit.name}: " + "; ".join(
            ([f"not in the model: {', '.join(unknown[:5])}"] if unknown else [])
            + ([f"missing from the adapter: {', '.join(missing[:5])}"] if missing else []) + wrong[:5]))
    for key, value in tensors.items():
        variables[key].assign(value)


# --- peft's layout --------------------------------------------------------------------------------

PEFT_DIR = "peft"  # <workdir>/peft: adapter_config.json + adapter_model.safetensors
# transformers 5's module names, which peft saves (module paths, not file names; keras_vit.weights.peft
# reads both generations back). The key table's block parts -> the module in a block:
_ATTENTION_PARTS = {"query": "attention.q_proj", "key": "attention.k_proj", "value": "attention.v_proj",
                    "out": "attention.o_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
_TOWER_PARTS = {"query": "self_attn.q_proj", "key": "self_attn.k_proj", "value": "self_attn.v_proj",
                "out": "self_attn.out_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


class PeftFamily(NamedTuple):
    """A transformers family as peft sees it: its blocks' path and their parts, and the classes a
    base folder is loaded as, each with the path its encoder sits under."""
    blocks: str  # "layers.{i}." under the class's prefix
    parts: dict
    classifier: Optional[Tuple[str, str, str]]  # (class, prefix, keras_vit's classifier kind) with a `classifier`
    bare: Optional[Tuple[str, str]]  # (class, prefix) of the encoder alone; None: always the classifier's
    others: Tuple[Tuple[str, str], ...] = ()  # other classes a base's config.json may name


# Per config.json model_type. ViT's and DeiT's classifier reads the class token after the final
# norm, as a keras_vit head on any such base does: a bare ViTModel base gets the classifier class.
# DINOv2's classifier reads the class token beside the patch tokens' mean and SigLIP's the tokens'
# mean: only a base that has it gives the run that head (keras_vit.weights.hf_families), so a run
# from a bare tower writes the updates alone, for the tower's own class (CLIP's classifier is not read).
_TOWERS = {"CLIPModel": "vision_model.", "CLIPVisionModelWithProjection": "vision_model.",
           "SiglipModel": "vision_model."}
PEFT_FAMILIES = {
    "vit": PeftFamily("layers.{i}.", _ATTENTION_PARTS, ("ViTForImageClassification", "vit.", "token"), None),
    "deit": PeftFamily("layers.{i}.", _ATTENTION_PARTS, ("DeiTForImageClassification", "deit.", "token"), None),
    "dinov2": PeftFamily("encoder.layer.{i}.", _ATTENTION_PARTS,
                         ("Dinov2ForImageClassification", "dinov2.", "token_gap"), ("Dinov2Model", "")),
    "dinov2_with_registers": PeftFamily(
        "encoder.layer.{i}.", _ATTENTION_PARTS,
        ("Dinov2WithRegistersForImageClassification", "dinov2_with_registers.", "token_gap"),
        ("Dinov2WithRegistersModel", "")),
    "clip": PeftFamily("encoder.layers.{i}.", _TOWER_PARTS, None, ("CLIPVisionModel", ""), tuple(_TOWERS.items())),
    "siglip": PeftFamily("encoder.layers.{i}.", _TOWER_PARTS,
                         ("SiglipForImageClassification", "vision_model.", "gap"), ("SiglipVisionModel", ""),
                         tuple(_TOWERS.items())),
}
PEFT_FAMILIES["clip_vision_model"] = PEFT_FAMILIES["clip"]
PEFT_FAMILIES["siglip_vision_model"] = PEFT_FAMILIES["siglip"]
_MODULE_OF = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}  # transformers.models.<module>


class PeftBase(NamedTuple):
    name: str  # peft's base_model_name_or_path
    config: dict  # the base's config.json


def peft_base(base) -> "PeftBase | None":
    """What peft's base_model_name_or_path is for a run's --weights: an HF transformers folder (its
    path) or `hf:ORG/NAME` (ORG/NAME) of a family in PEFT_FAMILIES, with its config.json; None
    for any other base, which peft cannot load."""
    import os

    from keras_vit.weights.checkpoint import read_json

    base = os.fspath(base)
    if base.startswith("hf:"):  # the run downloaded it at its start: the cache has it, no network asked
        from keras_vit.weights.download import cached_file

        name, _, revision = base[3:].partition("@")
        config = cached_file(name, "config.json", revision or None)
    else:
        name, config = base, os.path.join(base, "config.json")
    if config is None or not os.path.isfile(config):
        return None
    settings = read_json(config)
    return PeftBase(name, settings) if settings.get("model_type") in PEFT_FAMILIES else None


def _peft_class(family: PeftFamily, architecture: Optional[str], classifier: str) -> Tuple[str, str, bool]:
    """(class, prefix, whether our head is its `classifier`) the adapter applies to."""
    if family.classifier is not None:
        name, prefix, kind = family.classifier
        if family.bare is None or architecture == name:
            return name, prefix, classifier == kind
    others = dict(family.others)
    return (architecture, others[architecture], False) if architecture in others else (*family.bare, False)


def write_peft_adapter(workdir, vit, base: PeftBase) -> "str | None":
    """The LoRA updates (and the head, where the base's class has it) of `vit` as the peft adapter
    folder a PyTorch user loads with peft.PeftModel.from_pretrained(<adapter_config.json's
    auto_mapping base_model_class> of `base`, folder): lora_A.weight = A^T (r, in),
    lora_B.weight = B^T (out, r) under transformers 5's module names, the head as
    modules_to_save. -> the folder; None where an update has no module of that name (SwiGLU's
    fused fc1, which transformers holds as two)."""
    from safetensors.numpy import save

    from keras_vit.model.lora import adapter_params
    from keras_vit.weights.layout import BLOCK_PARTS, block_of

    model_type = base.config["model_type"]
    family = PEFT_FAMILIES[model_type]
    class_name, prefix, with_head = _peft_class(family, (base.config.get("architectures") or [None])[0],
                                                vit.config.classifier)
    parts = {path: name for name, path in BLOCK_PARTS.items()}
    tensors, targets = {}, set()
    for key, value in adapter_params(vit).items():
        if key.startswith("head/"):
            if with_head:
                leaf = "weight" if key.endswith("kernel") else "bias"
                tensors[f"base_model.model.classifier.{leaf}"] = value.T if leaf == "weight" else value
            continue
        block, (path, leaf) = block_of(key), key.split("/", 2)[2].rsplit("/", 1)
        part = parts[path]
        if part in ("fc1", "fc2") and vit.config.mlp_activation == "swiglu":
            return None
        module = prefix + family.blocks.format(i=block) + family.parts[part]
        targets.add(module.rsplit(".", 1)[1])
        factor = "lora_A" if leaf == "lora_a" else "lora_B"
        tensors[f"base_model.model.{module}.{factor}.weight"] = np.ascontiguousarray(value.T)
    lora = vit.config.lora
    settings = {"peft_type": "LORA", "base_model_name_or_path": base.name, "r": lora["rank"],
                "lora_alpha": lora["alpha"], "target_modules": sorted(targets),
                "modules_to_save": ["classifier"] if with_head else None,
                "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
                "fan_in_fan_out": False, "task_type": None, "inference_mode": True,
                "auto_mapping": {"base_model_class": class_name,
                                 "parent_library": f"transformers.models.{_MODULE_OF.get(model_type, model_type)}"
                                                   f".modeling_{_MODULE_OF.get(model_type, model_type)}"}}
    folder = storage.join(workdir, PEFT_DIR)
    storage.makedirs(folder)
    storage.write_bytes(storage.join(folder, "adapter_model.safetensors"),
                        save({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}))
    storage.write_text(storage.join(folder, "adapter_config.json"), json.dumps(settings, indent=2))
    return folder
