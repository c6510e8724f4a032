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
from keras_vit.runs.folder import find_labels, write_labels
from keras_vit.utils import storage
from keras_vit.weights.hf_modules import CLASSES, MODULE_OF, ModelClass, head_kind

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
# peft saves transformers 5's module paths, not file names: the blocks' are keras_vit.weights.hf_modules'
# (keras_vit.weights.peft reads both generations back through the same table).


# The classes a base loads as, per model_type, are keras_vit.weights.hf_modules.CLASSES: the peft
# reader finds an adapter's modules through the same table.


class PeftBase(NamedTuple):
    name: str  # peft's base_model_name_or_path: a Hub name, or a folder's absolute path
    config: dict  # the base's config.json
    revision: Optional[str] = None  # peft's revision: hf:ORG/NAME@REVISION's


def peft_base(base) -> "PeftBase | None":
    """What peft's base_model_name_or_path is for a run's --weights: an HF transformers folder (its
    absolute path, so the adapter loads from any directory) or `hf:ORG/NAME[@REVISION]` (ORG/NAME,
    and the revision peft then loads), of a family in CLASSES, with its config.json; None for
    any other base, which peft cannot load."""
    import os

    from keras_vit.weights.checkpoint import read_json

    base = os.fspath(base)
    if base.startswith("hf:"):  # the run downloaded it at its start: the cache has it, no network asked
        from keras_vit.weights.download import cached_file

        name, _, revision = base[3:].partition("@")
        config = cached_file(name, "config.json", revision or None)
    else:
        name, revision = os.path.abspath(base), None
        config = os.path.join(name, "config.json")
    if config is None or not os.path.isfile(config):
        return None
    settings = read_json(config)
    return PeftBase(name, settings, revision or None) if settings.get("model_type") in CLASSES else None


def _peft_class(classes: dict, architecture: Optional[str], head_kind: str) -> "Tuple[str, ModelClass] | None":
    """The class the adapter applies to: one whose classifier is the run's head (the base's own
    first: config.json's architectures), so that peft's logits are the run's; else one with no
    classifier, for the updates alone (the run's head stays in adapter.safetensors). None: none fits."""
    named = ([architecture] if architecture in classes else []) + [name for name in classes if name != architecture]
    for fits in (lambda c: c.head_kind == head_kind, lambda c: c.head_kind is None):
        for name in named:
            if fits(classes[name]):
                return name, classes[name]
    return None


def write_peft_adapter(workdir, vit, base: PeftBase) -> "str | None":
    """The LoRA updates (and the head, where the base's class has it) of `vit` as the peft adapter
    folder a PyTorch user loads with peft.PeftModel.from_pretrained(<adapter_config.json's
    auto_mapping base_model_class> of `base`, folder): lora_A.weight = A^T (r, in),
    lora_B.weight = B^T (out, r) under transformers 5's module names, the heads as
    modules_to_save; a gated MLP's fc1 as its two modules. -> the folder; None where no class fits
    or an update has no module there."""
    from safetensors.numpy import save

    from keras_vit.model.lora import adapter_params
    from keras_vit.weights.hf_modules import blocks_of

    model_type = base.config["model_type"]
    chosen = _peft_class(CLASSES[model_type], (base.config.get("architectures") or [None])[0],
                         head_kind(vit.config))
    if chosen is None:
        return None
    class_name, peft_class = chosen
    tensors = _peft_tensors(adapter_params(vit), blocks_of(base.config), peft_class)
    if tensors is None:
        return None
    lora, module = vit.config.lora, MODULE_OF.get(model_type, model_type)
    # Whole module paths: peft matches a bare name ("q_proj") anywhere, a full CLIPModel's text
    # tower and a SigLIP tower's attention-pooling head included, which the run did not adapt.
    targets = sorted({key[len("base_model.model."):].rsplit(".", 2)[0] for key in tensors if ".lora_" in key})
    settings = {"peft_type": "LORA", "base_model_name_or_path": base.name, "revision": base.revision,
                "r": lora["rank"],
                "lora_alpha": lora["alpha"], "target_modules": targets,
                "modules_to_save": sorted(peft_class.heads.values()) if peft_class.heads else None,
                "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
                "fan_in_fan_out": False, "task_type": None, "inference_mode": True,
                "auto_mapping": {"base_model_class": class_name,
                                 "parent_library": f"transformers.models.{module}.modeling_{module}"}}
    folder = storage.join(workdir, PEFT_DIR)
    if not peft_class.heads:  # said, so that nobody loads it under a classifier of random weights
        print(f"keras-vit train: {folder} holds the encoder's LoRA updates alone, for {class_name}: no "
              f"transformers image classifier loads this base, so the run's head is in {ADAPTER_FILE} only.",
              flush=True)
    storage.makedirs(folder)
    storage.write_bytes(storage.join(folder, "adapter_model.safetensors"),
                        save({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}))
    labels = find_labels(workdir) if peft_class.heads else None
    if labels:  # peft keeps no class names: beside its files, for id2label and keras_vit's reader
        write_labels(folder, labels, len(labels))
    storage.write_text(storage.join(folder, "adapter_config.json"), json.dumps(settings, indent=2))
    return folder


def _peft_tensors(params: dict, blocks, peft_class: ModelClass) -> "dict | None":
    """A LoRA run's adapter_params under peft's names; None if one has no module there."""
    from keras_vit.weights.layout import BLOCK_PARTS, block_of
    from keras_vit.weights.parts import CLASSIFIER_ROOTS

    parts = {path: name for name, path in BLOCK_PARTS.items()}
    tensors = {}
    for key, value in params.items():
        root, block = key.split("/", 1)[0], block_of(key)
        if block is None:  # a head: its class's module, or the class has none
            if root not in CLASSIFIER_ROOTS:
                return None
            if peft_class.heads is not None and root in peft_class.heads:
                leaf = "weight" if key.endswith("kernel") else "bias"
                tensors[f"base_model.model.{peft_class.heads[root]}.{leaf}"] = value.T if leaf == "weight" else value
            continue
        path, leaf = key.split("/", 2)[2].rsplit("/", 1)
        modules = blocks.modules_of(block, parts.get(path))
        if not modules:
            return None
        # A gated MLP's fc1 (the gate's outputs, then up's) is two modules in transformers: both
        # share A, and each takes its half of B's outputs. W + A B splits exactly so.
        halves = [value] * len(modules) if leaf == "lora_a" else np.split(value, len(modules), axis=-1)
        factor = "lora_A" if leaf == "lora_a" else "lora_B"
        for module, half in zip(modules, halves):
            tensors[f"base_model.model.{peft_class.prefix}{module}.{factor}.weight"] = np.ascontiguousarray(half.T)
    return tensors
