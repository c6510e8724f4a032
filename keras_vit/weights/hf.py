"""HF transformers ViT directories (config.json + model.safetensors), both ways.

The on-disk names are the ones `save_pretrained` writes (transformers 5 still
writes its 4.x names): "vit." + "embeddings.cls_token",
"encoder.layer.N.attention.attention.query.weight", ..., "layernorm.weight",
"pooler.dense.weight" (ViTModel with its pooler) and "classifier.weight"
(ViTForImageClassification). Without the "vit." prefix it is a bare ViTModel.

HF's ViT computes what the official one does, with its own numerics:
hidden_act="gelu" is the exact GELU, layer_norm_eps is 1e-12 by default;
both travel in ViTConfig so the loaded model gives HF's logits.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Dict, List, Optional

import numpy as np

from keras_vit import storage
from keras_vit.config import ViTConfig
from keras_vit.errors import UserError
from keras_vit.images import NORMALIZATIONS, pixel_normalization
from keras_vit.weights.checkpoint import (
    POSEMB_KEY,
    Checkpoint,
    attention_tensors,
    conv_kernel,
    linear_kernel,
    out_kernel,
    qkv_bias,
    qkv_kernel,
    read_json,
    read_safetensors,
    refuse_pickle,
    rename,
    write_safetensors,
)
from keras_vit.weights.hf_families import FAMILY_MODEL_TYPES, read_family
from keras_vit.weights.hf_families import hf_labels as _labels
from keras_vit.weights.layout import official_layout_error

logger = logging.getLogger("keras_vit")

# hidden_act -> gelu_approximate (keras.activations.gelu's flag).
_GELU = {"gelu": False, "gelu_pytorch_tanh": True, "gelu_new": True, "gelu_fast": True}
# Models that share ViT's config but not its computation.
# (DeiT, DINOv2, SigLIP and CLIP are read by keras_vit.weights.hf_families.)
_OTHER_MODELS = {
    "vit_hybrid": "HF's ViT-hybrid uses a BiT backbone whose layout keras-vit does not map; use the official "
                  "R50+B/16 .npz (weights='imagenet21k') instead",
    "vit_mae": "ViT-MAE checkpoints carry a decoder and fixed sin-cos position embeddings",
    "vit_msn": "ViT-MSN is not mapped",
}


def is_hf_directory(path) -> bool:
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return False
    try:
        return "model_type" in read_json(config)
    except ValueError:
        return False


_SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def config_from_hf(hf: dict, has_pooler: bool, where: str) -> ViTConfig:
    model_type = hf.get("model_type")
    if model_type in _OTHER_MODELS:
        raise UserError(f"{where} is a {model_type!r} model, not a ViT: {_OTHER_MODELS[model_type]}. It cannot "
                        f"be loaded without changing what it computes.")
    if model_type != "vit":
        raise UserError(f"{where} has model_type={model_type!r}; keras-vit reads HF ViT checkpoints "
                        f"(model_type 'vit') and those of {', '.join(sorted(FAMILY_MODEL_TYPES))} only.")
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        raise UserError(f"{where} uses hidden_act={act!r}; keras-vit's MLP is GELU (exact or tanh) only.")
    if not hf.get("qkv_bias", True):
        raise UserError(f"{where} has qkv_bias=False: keras-vit's attention always has query/key/value "
                        f"biases, so this layout cannot be expressed.")
    if has_pooler and hf.get("pooler_act", "tanh") != "tanh":
        raise UserError(f"{where} has pooler_act={hf['pooler_act']!r}; keras-vit's representation layer is tanh.")
    # Sizes are never left to defaults: transformers writes them all, so a missing one is a damaged file.
    missing = [k for k in _SIZE_FIELDS if k not in hf]
    if missing:
        raise UserError(f"{where}: config.json has no {', '.join(missing)} (transformers writes every size): "
                        f"the file is damaged; restore it from the original checkpoint.")
    hidden = int(hf["hidden_size"])
    return ViTConfig(
        patch_size=int(hf.get("patch_size", 16)),
        hidden_size=hidden,
        mlp_dim=int(hf["intermediate_size"]),
        num_heads=int(hf["num_attention_heads"]),
        num_layers=int(hf["num_hidden_layers"]),
        classifier="token",
        representation_size=int(hf.get("pooler_output_size") or hidden) if has_pooler else None,
        layer_norm_epsilon=float(hf.get("layer_norm_eps", 1e-12)),
        gelu_approximate=_GELU[act],
    )


def params_from_hf(tensors: Dict[str, np.ndarray], config: ViTConfig) -> Dict[str, np.ndarray]:
    """HF ViT tensors -> official layout; tensors it does not know keep their names."""
    prefix = "vit." if any(k.startswith("vit.") for k in tensors) else ""
    e, heads = prefix + "embeddings.", config.num_heads
    table = {
        "cls": (e + "cls_token", None),
        POSEMB_KEY: (e + "position_embeddings", None),
        "embedding/kernel": (e + "patch_embeddings.projection.weight", conv_kernel),
        "embedding/bias": (e + "patch_embeddings.projection.bias", None),
        "Transformer/encoder_norm/scale": (prefix + "layernorm.weight", None),
        "Transformer/encoder_norm/bias": (prefix + "layernorm.bias", None),
        "pre_logits/kernel": (prefix + "pooler.dense.weight", linear_kernel),
        "pre_logits/bias": (prefix + "pooler.dense.bias", None),
        "head/kernel": ("classifier.weight", linear_kernel),
        "head/bias": ("classifier.bias", None),
    }
    for i in range(config.num_layers):
        h, o = f"{prefix}encoder.layer.{i}.", f"Transformer/encoderblock_{i}/"
        a = o + "MultiHeadDotProductAttention_1/"
        for name in ("query", "key", "value"):
            table[a + name + "/kernel"] = (h + f"attention.attention.{name}.weight", lambda w: qkv_kernel(w, heads))
            table[a + name + "/bias"] = (h + f"attention.attention.{name}.bias", lambda b: qkv_bias(b, heads))
        table[a + "out/kernel"] = (h + "attention.output.dense.weight", lambda w: out_kernel(w, heads))
        table[a + "out/bias"] = (h + "attention.output.dense.bias", None)
        for ours, theirs in (("LayerNorm_0", "layernorm_before"), ("LayerNorm_2", "layernorm_after")):
            table[o + ours + "/scale"] = (h + theirs + ".weight", None)
            table[o + ours + "/bias"] = (h + theirs + ".bias", None)
        for ours, theirs in (("Dense_0", "intermediate.dense"), ("Dense_1", "output.dense")):
            table[o + f"MlpBlock_3/{ours}/kernel"] = (h + theirs + ".weight", linear_kernel)
            table[o + f"MlpBlock_3/{ours}/bias"] = (h + theirs + ".bias", None)
    return rename(tensors, table)


def read_hf_directory(directory, source: Optional[str] = None) -> Checkpoint:
    """An HF transformers ViT (or DeiT, DINOv2, SigLIP, CLIP: hf_families) directory as a Checkpoint."""
    directory = os.fspath(directory)
    where = source or directory
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
    hf = read_json(os.path.join(directory, "config.json"))
    tensors = read_safetensors(weights)
    if hf.get("model_type") in FAMILY_MODEL_TYPES:  # ViT's relatives: DeiT, DINOv2, SigLIP, CLIP
        return read_family(hf, tensors, where)
    has_pooler = any(k.endswith("pooler.dense.weight") for k in tensors)
    config = config_from_hf(hf, has_pooler, where)
    if not any(k.endswith("embeddings.cls_token") for k in tensors):
        raise UserError(f"{where}: model.safetensors has no embeddings.cls_token; is it an HF ViT checkpoint?")
    params = params_from_hf(tensors, config)
    normalization = processor_normalization(directory, where)
    if normalization is not None:
        config = config.replace(pixel_normalization=normalization)
    size = hf.get("image_size", 224)
    image_size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
    head = params.get("head/kernel")
    return Checkpoint(config=config, params=params, image_size=image_size,
                      labels=_labels(hf, None if head is None else head.shape[-1]), source=where,
                      num_channels=int(hf.get("num_channels", 3)))


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
    logger.warning("keras_vit: %s normalises images with mean %s and std %s, which keras-vit does not name: "
                   "normalise them that way yourself.", where, mean, std)
    return None


# --- writing ---

def _family_problems(config: ViTConfig) -> List[str]:
    """What a model read from DeiT, DINOv2, SigLIP or CLIP has that HF's ViT does not compute."""
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
    """The model's weights under HF ViT names (the inverse of params_from_hf)."""
    from keras_vit.weights.npz import checkpoint_params

    p = checkpoint_params(model)
    prefix = "vit." if model.include_top else ""
    e = prefix + "embeddings."
    t = {
        e + "cls_token": p["cls"],
        e + "position_embeddings": p[POSEMB_KEY],
        e + "patch_embeddings.projection.weight": p["embedding/kernel"].transpose(3, 2, 0, 1),
        e + "patch_embeddings.projection.bias": p["embedding/bias"],
        prefix + "layernorm.weight": p["Transformer/encoder_norm/scale"],
        prefix + "layernorm.bias": p["Transformer/encoder_norm/bias"],
    }
    for i in range(model.config.num_layers):
        h, o = f"{prefix}encoder.layer.{i}.", f"Transformer/encoderblock_{i}/"
        names = ("attention.attention.query", "attention.attention.key", "attention.attention.value",
                 "attention.output.dense")
        for name, (weight, bias) in zip(names, attention_tensors(o + "MultiHeadDotProductAttention_1", p)):
            t[h + name + ".weight"], t[h + name + ".bias"] = weight, bias
        for ours, theirs in (("LayerNorm_0", "layernorm_before"), ("LayerNorm_2", "layernorm_after")):
            t[h + theirs + ".weight"], t[h + theirs + ".bias"] = p[o + ours + "/scale"], p[o + ours + "/bias"]
        for ours, theirs in (("Dense_0", "intermediate.dense"), ("Dense_1", "output.dense")):
            t[h + theirs + ".weight"] = p[o + f"MlpBlock_3/{ours}/kernel"].T
            t[h + theirs + ".bias"] = p[o + f"MlpBlock_3/{ours}/bias"]
    if "pre_logits/kernel" in p:
        t[prefix + "pooler.dense.weight"] = p["pre_logits/kernel"].T
        t[prefix + "pooler.dense.bias"] = p["pre_logits/bias"]
    if "head/kernel" in p:
        t["classifier.weight"], t["classifier.bias"] = p["head/kernel"].T, p["head/bias"]
    return t


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
