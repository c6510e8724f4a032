"""LoRA fine-tuning of a ViT: what trains, what merging gives, what an adapter holds.

A ViT built with `lora_rank` (ViTConfig) carries a LowRankUpdate beside each
targeted projection of every block; this module freezes everything else but
the classification head (`freeze_for_lora`, which the ViT calls when it is
built), merges the updates into the kernels for a plain model
(`merge_lora`: what a run's model.keras holds, what every export reads) and
names an adapter's weights (`adapter_params`: the updates and the head, in
the key table's names).

Which weights are the head is the parts description's answer
(keras_vit.weights.parts: the "classifier" group), the one every rule reads.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from keras_vit.config import DEFAULT_LORA_TARGETS
from keras_vit.weights.layout import is_lora_key, variables_by_key
from keras_vit.weights.parts import CLASSIFIER, part_of


def freeze_for_lora(vit) -> None:
    """Leaves trainable only the LoRA updates and the classification head
    (DeiT's two heads): the weights a LoRA run changes."""
    for key, variable in variables_by_key(vit).items():
        variable.trainable = is_lora_key(key) or part_of(key).group == CLASSIFIER


def parameter_counts(model) -> Dict[str, int]:
    """{"trainable", "total"} weights of `model` (numbers, not variables)."""
    count = lambda variables: int(sum(np.prod(v.shape) for v in variables))  # noqa: E731
    return {"trainable": count(model.trainable_variables), "total": count(model.weights)}


def merged_params(vit) -> dict:
    """The ViT's weights by key with every LoRA update added into its kernel
    (kernel += alpha / rank * A B, in the kernel's axes) and the factors left out."""
    return merge_updates({key: np.asarray(variable) for key, variable in variables_by_key(vit).items()},
                         vit.config.lora["alpha"] / vit.config.lora_rank)


def merge_updates(params: dict, scale: float) -> dict:
    """`params` ({key: array}) with each "<projection>/lora_a" and "lora_b" pair added into
    "<projection>/kernel" (kernel += scale * A B, in the kernel's axes) and the factors left out."""
    params = dict(params)
    for key in [k for k in params if k.endswith("/lora_a")]:
        prefix = key[:-len("/lora_a")]
        a, b = params.pop(key), params.pop(f"{prefix}/lora_b")
        kernel = params[f"{prefix}/kernel"]
        params[f"{prefix}/kernel"] = (kernel + scale * (a @ b).reshape(kernel.shape)).astype(kernel.dtype)
    return params


def merge_lora(vit):
    """A plain ViT (no LoRA updates) computing what `vit` computes: the
    updates merged into the kernels; `vit` itself when it has none. On a
    quantised base (QLoRA) the merged model is float: the kernels the base
    multiplies by plus the updates (int8's rounding of the inputs aside),
    which `quantize` may round again."""
    if not vit.config.lora_rank:
        return vit
    if vit.config.quantization:  # QLoRA: the updates go into the float kernels the base multiplies by
        from keras_vit.model.quantization import dequantized

        return merge_lora(dequantized(vit))
    from keras_vit.weights.npz import load_checkpoint

    config = vit.get_config()
    config["config"] = {**config["config"], "lora_rank": 0, "lora_alpha": None,
                        "lora_targets": list(DEFAULT_LORA_TARGETS)}
    plain = type(vit).from_config(config)
    load_checkpoint(plain, merged_params(vit))
    plain.check_input_range = vit.check_input_range
    return plain


def adapter_params(vit) -> dict:
    """{key: value} of what a LoRA run trains: the updates' factors and the head."""
    return {key: np.asarray(variable) for key, variable in variables_by_key(vit).items()
            if is_lora_key(key) or part_of(key).group == CLASSIFIER}
