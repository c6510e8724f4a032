"""The text half of an HF transformers image-text checkpoint: SiglipModel, Siglip2Model,
CLIPModel and MetaClip2Model's text tower, its projection, and the logit scale (and SigLIP's
bias) that turn two embeddings into a logit.

The image half is read by keras_vit.weights.hf_families as every tower is; this reads what
that one leaves out, into keras_vit.config.TextConfig and the text keys of
keras_vit.weights.layout (text_variables_by_key). The blocks are the vision tower's blocks
(keras_vit.weights.hf_modules.TOWER) under "text_model.".

Defaults of absent text_config fields are transformers' own (its *TextConfig classes),
copied here: keras_vit never imports transformers.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import numpy as np

from keras_vit.config import TextConfig
from keras_vit.errors import UserError
from keras_vit.weights.checkpoint import activation, rename, torch_block, torch_dense, torch_norm
from keras_vit.weights.hf_modules import TOWER
from keras_vit.weights.layout import ENCODER_NORM, TEXT_ROOT

# transformers 5's SiglipTextConfig and Siglip2TextConfig (the same), CLIPTextConfig and
# MetaClip2TextConfig (the same).
_SIGLIP_TEXT = dict(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                    num_attention_heads=12, max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                    layer_norm_eps=1e-6, pad_token_id=1, bos_token_id=49406, eos_token_id=49407)
_CLIP_TEXT = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                  pad_token_id=1, bos_token_id=49406, eos_token_id=49407)

# model_type -> (family name, text defaults, the loss its logits were trained with)
FAMILIES = {
    "siglip": ("SigLIP", _SIGLIP_TEXT, "sigmoid"),
    "siglip2": ("SigLIP2", _SIGLIP_TEXT, "sigmoid"),
    "clip": ("CLIP", _CLIP_TEXT, "softmax"),
    "metaclip_2": ("MetaCLIP 2", _CLIP_TEXT, "softmax"),
}

_TOWERS_ONLY = {  # model_types of one tower, and what to load instead
    "siglip_vision_model": "SiglipModel", "siglip2_vision_model": "Siglip2Model",
    "clip_vision_model": "CLIPModel", "metaclip_2_vision_model": "MetaClip2Model",
    "clip_text_model": "CLIPModel", "siglip_text_model": "SiglipModel",
}


class TextHalf(NamedTuple):
    """What an image-text checkpoint holds beside its image tower."""

    family: str  # "SigLIP", "SigLIP2", "CLIP", "MetaCLIP 2"
    model_type: str
    config: TextConfig
    params: Dict[str, np.ndarray]  # text keys (layout.text_variables_by_key) -> arrays
    loss: str  # "sigmoid" (SigLIP, SigLIP2) or "softmax" (CLIP, MetaCLIP 2)
    logit_scale: float  # log of the temperature's inverse, as stored
    logit_bias: Optional[float]  # SigLIP's; None for CLIP
    pad_token_id: Optional[int]
    eos_token_id: Optional[int]


def read_text_half(hf: dict, tensors: Dict[str, np.ndarray], where: str) -> TextHalf:
    """The text tower, projection and logit scale of a full image-text checkpoint; a one-line
    UserError for any other model_type (a single tower names the model to load instead)."""
    model_type = hf.get("model_type")
    if model_type in _TOWERS_ONLY:
        raise UserError(f"{where} is a single tower ({model_type}): image-text needs both towers, as "
                        f"transformers' {_TOWERS_ONLY[model_type]}.save_pretrained writes them.")
    if model_type not in FAMILIES:
        raise UserError(f"{where} has model_type={model_type!r}, not an image-text model: keras-vit reads both "
                        f"towers of {', '.join(sorted(FAMILIES))} checkpoints.")
    family, defaults, loss = FAMILIES[model_type]
    c = dict(defaults)
    c.update({k: v for k, v in (hf.get("text_config") or {}).items() if v is not None})
    layers, heads, width = int(c["num_hidden_layers"]), int(c["num_attention_heads"]), int(c["hidden_size"])
    prefix = "text_model."
    if prefix + "embeddings.token_embedding.weight" not in tensors:
        raise UserError(f"{where}: model.safetensors has no text tower (text_model.*); is it a full {family} "
                        f"checkpoint?")
    table = {"token_embedding": (prefix + "embeddings.token_embedding.weight", None),
             "position_embedding": (prefix + "embeddings.position_embedding.weight", None)}
    for i in range(layers):
        torch_block(table, i, prefix + TOWER.on_disk.format(i=i), TOWER.parts, heads)
    torch_norm(table, ENCODER_NORM, prefix + "final_layer_norm")
    sigmoid = loss == "sigmoid"
    torch_dense(table, "projection", prefix + "head" if sigmoid else "text_projection", bias=sigmoid)
    text = {k: v for k, v in tensors.items() if k.startswith(prefix) or k.startswith("text_projection.")}
    text = {k: v for k, v in text.items() if not k.endswith(".position_ids")}  # torch buffers, not weights
    params = {TEXT_ROOT + key: value for key, value in rename(text, table).items()}
    projection = tensors.get(prefix + "head.weight" if sigmoid else "text_projection.weight")
    mlp_activation, gelu_approximate = activation(c["hidden_act"], "text_config.hidden_act", where)
    eos = c.get("eos_token_id")
    eos = int(eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else None
    # CLIP files from before transformers' PR 24773 say eos_token_id=2 and are read at the largest
    # id (transformers keeps that for CLIP alone, not MetaCLIP 2).
    pooling = "last" if sigmoid else ("max_id" if model_type == "clip" and eos == 2 else "eos")
    config = TextConfig(
        vocab_size=int(c["vocab_size"]), max_positions=int(c["max_position_embeddings"]), width=width,
        num_layers=layers, num_heads=heads, mlp_dim=int(c["intermediate_size"]),
        layer_norm_epsilon=float(c["layer_norm_eps"]), mlp_activation=mlp_activation,
        gelu_approximate=gelu_approximate, causal=not sigmoid, pooling=pooling,
        eos_token_id=eos, projection_size=None if projection is None else int(projection.shape[0]),
        projection_bias=sigmoid)
    for name in ("logit_scale",) + (("logit_bias",) if sigmoid else ()):
        if name not in tensors:
            raise UserError(f"{where}: model.safetensors has no {name}; is it a full {family} checkpoint?")
    return TextHalf(family, model_type, config, params, loss, float(np.reshape(tensors["logit_scale"], -1)[0]),
                    float(np.reshape(tensors["logit_bias"], -1)[0]) if sigmoid else None,
                    c.get("pad_token_id"), eos)


def load_text_params(tower, params: Dict[str, np.ndarray], where: str) -> None:
    """Assigns a TextHalf's params to a TextTower, after checking every key and shape (a tower
    with LoRA's updates keeps them as built: a checkpoint has none)."""
    from keras_vit.weights.layout import is_lora_key, text_variables_by_key

    expected = {key: variable for key, variable in text_variables_by_key(tower).items() if not is_lora_key(key)}
    missing = sorted(set(expected) - set(params))
    unexpected = sorted(set(params) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(params[k].shape)}, model {tuple(expected[k].shape)}"
                  for k in sorted(set(expected) & set(params)) if tuple(params[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or mismatched:
        problems = [f"missing {', '.join(missing[:5])}" if missing else "",
                    f"not in the model {', '.join(unexpected[:5])}" if unexpected else "",
                    "; ".join(mismatched[:5])]
        raise UserError(f"{where}: the text tower does not match its config.json: "
                        + "; ".join(p for p in problems if p) + ".")
    for key, variable in expected.items():
        variable.assign(params[key].astype(np.float32))
