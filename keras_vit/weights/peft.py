"""peft LoRA adapter folders (adapter_config.json + adapter_model.safetensors), read merged.

A peft adapter names its base (`base_model_name_or_path`: an HF transformers
folder or Hub name) and holds, for each adapted module, lora_A.weight (r, in)
and lora_B.weight (out, r), plus whole tensors that replace the base's
(`modules_to_save`: a new classifier; trained biases). Reading one merges it
into the base's tensors, W + scale * B A with scale alpha / r (alpha / sqrt(r)
with rsLoRA; `rank_pattern`/`alpha_pattern` per module), under the base's
on-disk names, and hands them to the base family's adapter
(keras_vit.weights.hf): the Checkpoint is the base's architecture with the
adapter's function. The files are safetensors: nothing is unpickled.

An adapter names modules as its model held them, and people train on one class of a base saved
as another: a bare `ViTModel` or `Dinov2Model` loaded into `ViTForImageClassification` with
`modules_to_save=["classifier"]` ("vit.layers.0..." for "encoder.layer.0..." on disk, a
`classifier` the base has not). So a module is also looked up without its class's prefix, or
with the base's, and a classifier the base lacks is added: the base then reads as that family's
image classifier (keras_vit.weights.hf_families).

Initialisations that also change the base (PiSSA, OLoRA, CorDA, LoRA-GA: the base becomes
W - scale * B0 A0; LoftQ: a quantised residual) are applied to a base that peft does not save:
they are refused, with peft's own conversion as the way out.

peft saves module paths, not file names. transformers 5 renamed ViT's,
DeiT's, DINOv2's and DINOv3's modules (`vit.layers.0.attention.q_proj`, where 4.x and
every file on disk say `vit.encoder.layer.0.attention.attention.query`), so
adapters of both generations exist: each module is looked up under its own name
first, then under its name on disk (keras_vit.weights.hf_modules, the one table of both).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from keras_vit.errors import UserError
from keras_vit.utils.labels import labels_in_text
from keras_vit.weights.checkpoint import Checkpoint, read_json, read_tensors_file
from keras_vit.weights.hf_modules import CLASS_PREFIXES, CLASSIFIER_MODULES, blocks_of

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_BIN = "adapter_model.bin"  # peft's pickled form: refused
PREFIX = "base_model.model."  # what peft puts before every module path it saves


def is_peft_directory(path) -> bool:
    return os.path.isfile(os.path.join(os.fspath(path), ADAPTER_CONFIG))


def read_peft_directory(directory, source: Optional[str] = None, new_head: bool = False) -> Checkpoint:
    """The base a peft LoRA adapter folder names, with the adapter merged (see the module docstring);
    new_head: read_hf_directory's, for an adapter without a classifier."""
    from keras_vit.weights.hf import is_hf_directory, read_hf_directory, read_hf_tensors
    from keras_vit.weights.hf_families import check_model_type

    directory = os.fspath(directory)
    where = source or directory
    settings = read_json(os.path.join(directory, ADAPTER_CONFIG))
    adapter = read_tensors_file(os.path.join(directory, ADAPTER_WEIGHTS), pickled=os.path.join(directory, ADAPTER_BIN))
    _check_settings(settings, where)  # a kind of adapter refused is said before a missing file
    if adapter is None:
        raise UserError(f"{where} has no {ADAPTER_WEIGHTS} next to its {ADAPTER_CONFIG}.")
    names = _labels(os.path.join(directory, LABELS_FILE))
    base = _base_directory(settings, where, directory)
    if not is_hf_directory(base):
        raise UserError(f"{where}: its base {settings['base_model_name_or_path']!r} is not an HF transformers folder "
                        f"(config.json with model_type + model.safetensors): peft adapters of transformers models "
                        f"are read.")
    base_config = read_json(os.path.join(base, "config.json"))
    check_model_type(base_config, f"{where}: its base {base}")  # before the merge names a module it lacks
    tensors = read_hf_tensors(base, base)
    renames = _renames(base_config)
    merged = merge_adapter(tensors, adapter, settings, f"{where} (base {base})", renames)
    checkpoint = read_hf_directory(base, source=f"{where} (peft LoRA on {settings['base_model_name_or_path']})",
                                   tensors=merged, new_head=new_head)
    # The class names beside the adapter, where they name each class of the head.
    if names is None or checkpoint.num_classes is None or len(names) != checkpoint.num_classes:
        return checkpoint
    return dataclasses.replace(checkpoint, labels=names)


LABELS_FILE = "labels.txt"  # one class name a line: what keras-vit's writer puts beside a run's adapter


def _labels(path: str) -> Optional[List[str]]:
    """The class names of labels.txt beside the adapter (peft keeps none: the classifier's
    id2label lives in the PyTorch model's config), or None."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return labels_in_text(f.read())  # as a run folder's labels.txt is read


def _check_settings(settings: dict, where: str) -> None:
    kind = settings.get("peft_type")
    refusals = [
        (kind != "LORA", f"is a peft {kind} adapter; keras-vit reads LoRA adapters"),
        (settings.get("use_dora"), "is a DoRA adapter (use_dora), which is not a plain low-rank update"),
        (settings.get("fan_in_fan_out"), "stores transposed (fan_in_fan_out, GPT-2's Conv1D layers)"),
        (settings.get("layer_replication"), "replicates layers (layer_replication)"),
        (settings.get("target_parameters"), "adapts parameters, not modules (target_parameters)"),
        (settings.get("lora_bias"), "trains a LoRA bias (lora_bias)"),
        (settings.get("use_bdlora"), "shares its factors across blocks (use_bdlora)"),
        (settings.get("kasa_config"), "is a KaSA adapter (kasa_config: the base cut down by SVD, a diagonal added)"),
        (settings.get("trainable_token_indices"), "trains embedding rows (trainable_token_indices)"),
        (settings.get("alora_invocation_tokens"), "is an activated LoRA (alora_invocation_tokens), on by token"),
        (settings.get("arrow_config"), "routes among several adapters (arrow_config)"),
    ]
    for refused, why in refusals:
        if refused:
            raise UserError(f"{where} {why}: merge it with peft (model.merge_and_unload(), then save_pretrained) "
                            f"and load that folder.")
    init = settings.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_CHANGES_BASE):
        how = ("merge it with peft (model.merge_and_unload(), then save_pretrained) and load that folder"
               if init.lower() == "loftq" else
               "save it again with peft's save_pretrained(DIR, path_initial_model_for_weight_conversion=<the "
               "untrained adapter's folder>), which writes it as an update of the original base")
        raise UserError(f"{where} was initialised with init_lora_weights={init!r}, which also changes the base's "
                        f"weights, and peft saved the adapter without that changed base: {how}.")


# init_lora_weights that subtract the initial update from the base (peft's LoraLayer.*_init).
_CHANGES_BASE = ("pissa", "olora", "corda", "loftq", "lora_ga")


def _base_directory(settings: dict, where: str, directory: str) -> str:
    """The base's folder: a path as peft wrote it (a relative one from the working directory, else
    from the adapter's folder or the folder holding it: the two moved together), else a Hub name
    at the adapter's revision."""
    name = settings.get("base_model_name_or_path")
    if not name:
        raise UserError(f"{where}: adapter_config.json names no base model (base_model_name_or_path): set it to "
                        f"the base's folder or Hub name, as peft writes it when the base came from from_pretrained.")
    if os.path.isdir(name):
        return name
    if not os.path.isabs(name):
        for beside in (directory, os.path.dirname(os.path.abspath(directory))):
            if os.path.isdir(os.path.join(beside, name)):
                return os.path.join(beside, name)
    if os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") != 1:
        raise UserError(f"{where}: its base model {name!r} does not exist: put the base's folder there, or set "
                        f"base_model_name_or_path in adapter_config.json to where it is.")
    from keras_vit.weights.download import hf_directory

    return hf_directory(name, settings.get("revision") or None)


def _renames(config: dict) -> List[Tuple[str, str, Optional[int]]]:
    """(pattern, replacement, half) from a transformers 5 module path of the base's blocks to its
    tensor on disk (half: 0 or 1 where a gated MLP's two modules are one tensor's halves there)."""
    blocks = blocks_of(config)
    if blocks is None:
        return []
    renames = []
    for module, on_disk, half in blocks.renames():
        whole = module.endswith(".")  # a block's path: what follows it keeps its name
        pattern = r"(^|\.)" + re.escape(module).replace(re.escape("{i}"), r"(\d+)") + ("(.+)$" if whole else "$")
        renames.append((pattern, r"\g<1>" + on_disk.replace("{i}", r"\g<2>") + (r"\g<3>" if whole else ""), half))
    return renames


def merge_adapter(base: Dict[str, np.ndarray], adapter: Dict[str, np.ndarray], settings: dict,
                  where: str, renames=()) -> Dict[str, np.ndarray]:
    """The base's tensors (on-disk names) with the adapter merged: each lora_A/lora_B
    pair added into its module's weight, every other adapter tensor replacing the base's.
    `renames`: _renames of the base's config.json."""
    merged = dict(base)
    pairs: Dict[str, dict] = {}
    for name, value in adapter.items():
        name = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if ".original_module." in name:  # a modules_to_save wrapper's untrained original, which peft does not run
            continue
        # peft's wrappers: a LoRA layer's own weights under .base_layer (bias="all"), a saved module's
        # copy under .modules_to_save: the module's own tensors, as the files name them.
        name = re.sub(r"\.(base_layer|modules_to_save)(?=\.)", "", name)
        match = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", name)
        if match:
            pairs.setdefault(match.group(1), {})[match.group(2)] = value
            continue
        module, leaf = name.rsplit(".", 1)  # modules_to_save, trained biases
        if _new_classifier(module, base):  # a classifier the base has not (a bare ViTModel's new head)
            merged[f"{module.rsplit('.', 1)[-1]}.{leaf}"] = value
            continue
        on_disk, half = _on_disk(module, base, where, renames)
        if half is None:
            merged[f"{on_disk}.{leaf}"] = value
        else:
            _half(merged, f"{on_disk}.{leaf}", half, where)[...] = value
    for module, factors in sorted(pairs.items()):
        if set(factors) != {"A", "B"}:
            raise UserError(f"{where}: the adapter holds lora_{''.join(sorted(factors))} of {module} without its pair.")
        a, b = factors["A"].astype(np.float64), factors["B"].astype(np.float64)
        on_disk, half = _on_disk(module, base, where, renames)
        weight = _half(merged, f"{on_disk}.weight", half, where)
        if a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != weight.shape:
            raise UserError(f"{where}: the update of {module} ({b.shape[0]}x{a.shape[1]}) does not fit the base's "
                            f"{on_disk}.weight {weight.shape}: the adapter was trained on another architecture; "
                            f"give it the base it was trained on.")
        weight[...] = weight.astype(np.float64) + _scale(module, a.shape[0], settings) * (b @ a)
    return merged


def _half(merged: Dict[str, np.ndarray], name: str, half: Optional[int], where: str) -> np.ndarray:
    """A writable view of merged[name], copied first (the base's arrays may be read-only and stay
    untouched), or of the half of its rows that one module of a gated MLP is on disk (the gate: 0,
    up: 1)."""
    if name not in merged:
        raise UserError(f"{where}: the adapter holds {name}, which the base has no tensor of: the adapter was "
                        f"trained on another architecture; give it the base it was trained on.")
    merged[name] = np.array(merged[name], copy=True)
    if half is None:
        return merged[name]
    rows = merged[name].shape[0] // 2
    return merged[name][half * rows:(half + 1) * rows]


def _new_classifier(module: str, base: Dict[str, np.ndarray]) -> bool:
    """Whether `module` is a transformers classifier (at the top of its class, "classifier",
    DeiT's two) that the base has no tensor of."""
    return module in CLASSIFIER_MODULES and not any(key.startswith(module + ".") for key in base)


def _prefixed(module: str, base: Dict[str, np.ndarray]) -> List[str]:
    """`module`, then the same module under the base's class prefix or without its own (an adapter
    trained on another class of the base than the one saved: "vit.layers.0" on a bare ViTModel)."""
    own = next((p for p in CLASS_PREFIXES if module.startswith(p)), "")
    stem = module[len(own):]
    theirs = [p for p in CLASS_PREFIXES if any(key.startswith(p) for key in base)]
    return [module] + [p + stem for p in [""] + theirs if p != own]


def _on_disk(module: str, base: Dict[str, np.ndarray], where: str, renames) -> Tuple[str, Optional[int]]:
    """The base's on-disk name of an adapter's module path (its own, or transformers 5's renamed,
    under the base's class prefix), and the half of it the module is (None: all)."""
    candidates = [(path, None) for path in _prefixed(module, base)] + [
        (re.sub(pattern, name, path), half) for path in _prefixed(module, base)
        for pattern, name, half in renames if re.search(pattern, path)]
    for candidate, half in candidates:
        if any(key.startswith(candidate + ".") for key in base):
            return candidate, half
    raise UserError(f"{where}: the adapter's module {module} is not in the base model: the adapter was trained on "
                    f"another architecture; give it the base it was trained on.")


def _scale(module: str, rank: int, settings: dict) -> float:
    """alpha / r of one module (alpha / sqrt(r) with rsLoRA), alpha_pattern's alpha where a pattern
    names the module (peft's rule: the pattern matches the path's end)."""
    alpha = settings.get("lora_alpha", 8)
    for pattern, value in (settings.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?(?:{pattern})", module):
            alpha = value
            break
    return alpha / (rank ** 0.5 if settings.get("use_rslora") else rank)
