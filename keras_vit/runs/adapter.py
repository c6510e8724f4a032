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
# The key table's block parts -> transformers 5's module names in ViTForImageClassification
# (what peft saves: module paths, not file names; keras_vit.weights.peft reads them back).
_PEFT_MODULES = {"query": "attention.q_proj", "key": "attention.k_proj", "value": "attention.v_proj",
                 "out": "attention.o_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def peft_base(base) -> "str | None":
    """What peft's base_model_name_or_path is for a run's --weights: an HF transformers ViT
    folder (its path) or `hf:ORG/NAME` (ORG/NAME); None for any other base, which peft
    cannot load."""
    import os

    from keras_vit.weights.checkpoint import read_json

    base = os.fspath(base)
    if base.startswith("hf:"):  # the run downloaded it at its start: the cache has it, no network asked
        from keras_vit.weights.download import cached_file

        name, _, revision = base[3:].partition("@")
        config = cached_file(name, "config.json", revision or None)
    else:
        name, config = base, os.path.join(base, "config.json")
    if config is None or not os.path.isfile(config) or read_json(config).get("model_type") != "vit":
        return None
    return name


def write_peft_adapter(workdir, vit, base: str) -> str:
    """The LoRA updates and the head of `vit` as the peft adapter folder a PyTorch user
    loads with peft.PeftModel.from_pretrained(ViTForImageClassification of `base`, folder):
    lora_A.weight = A^T (r, in), lora_B.weight = B^T (out, r) under transformers 5's module
    names, the head as modules_to_save. -> the folder."""
    from safetensors.numpy import save

    from keras_vit.model.lora import adapter_params
    from keras_vit.weights.layout import BLOCK_PARTS, block_of

    lora = vit.config.lora
    parts = {path: name for name, path in BLOCK_PARTS.items()}
    tensors, targets = {}, set()
    for key, value in adapter_params(vit).items():
        if key.startswith("head/"):
            leaf = "weight" if key.endswith("kernel") else "bias"
            tensors[f"base_model.model.classifier.{leaf}"] = value.T if leaf == "weight" else value
            continue
        block, (path, leaf) = block_of(key), key.split("/", 2)[2].rsplit("/", 1)
        module = _PEFT_MODULES[parts[path]]
        targets.add(module.rsplit(".", 1)[1])
        factor = "lora_A" if leaf == "lora_a" else "lora_B"
        tensors[f"base_model.model.vit.layers.{block}.{module}.{factor}.weight"] = np.ascontiguousarray(value.T)
    settings = {"peft_type": "LORA", "base_model_name_or_path": base, "r": lora["rank"],
                "lora_alpha": lora["alpha"], "target_modules": sorted(targets), "modules_to_save": ["classifier"],
                "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
                "fan_in_fan_out": False, "task_type": None, "inference_mode": True,
                "auto_mapping": {"base_model_class": "ViTForImageClassification",
                                 "parent_library": "transformers.models.vit.modeling_vit"}}
    folder = storage.join(workdir, PEFT_DIR)
    storage.makedirs(folder)
    storage.write_bytes(storage.join(folder, "adapter_model.safetensors"),
                        save({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}))
    storage.write_text(storage.join(folder, "adapter_config.json"), json.dumps(settings, indent=2))
    return folder
