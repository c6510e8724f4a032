"""timm checkpoints of ViT's relatives: DeiT (distilled or not), DINOv2 (with
and without registers, MLP or SwiGLU), SigLIP and SigLIP2 (MAP head, or
average pooling), CLIP towers, DINOv3 (timm/models/eva.py: rotary positions,
gamma_1/2, q_bias/v_bias, SwiGLU's fc1_g/fc1_x, the patch tokens' mean) and
AIMv2 (RmsNorm, patch_embed.norm, no biases).

timm cannot be imported here (it needs a CUDA torchvision), so each test
builds a small random transformers model of the family (an independent
implementation), writes its tensors in timm's layout by hand, as timm's
model holds them (timm/models/vision_transformer.py VisionTransformer and
checkpoint_filter_fn / _convert_dinov2 / _convert_openai_clip,
timm/models/deit.py VisionTransformerDistilled, timm/layers/attention_pool.py
AttentionPoolLatent, timm/layers/mlp.py SwiGLUPacked), with the config.json
timm's push_to_hub writes, and compares keras_vit.from_pretrained to
transformers' outputs.

At another size timm resizes the position table with resample_abs_pos_embed
(F.interpolate bicubic with antialias=True on the grid rows), which is not
transformers' rule for most of these families; the reference there is the
transformers model rebuilt at the new size with its table resized by that
torch call."""

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import keras_vit
from keras_vit.weights.checkpoint import POSEMB_KEY
from keras_vit.weights.timm import read_timm
from tests.sources_helpers import perturb_torch
from tests.test_hf_families import D, HEADS, LAYERS, MLP, images, naflex, pixels, siglip2_vision, small

CLASSES = 5
NAMES = ["ant", "bee", "cat", "dog", "eel"]
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
CLIP = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
HALF = ([0.5] * 3, [0.5] * 3)


# --- timm's layout, by hand ---

def fuse(s, h, names):
    """One encoder block of a transformers model (source prefix h) as timm's blocks.N (fused qkv)."""
    out = {}
    for leaf in ("weight", "bias"):
        out[f"attn.qkv.{leaf}"] = np.concatenate([s[h + names[p] + "." + leaf] for p in ("q", "k", "v")])
        for ours in ("proj", "norm1", "norm2", "fc1", "fc2"):
            theirs = names[ours]
            out[{"proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}.get(ours, ours) + "." + leaf] = \
                s[h + theirs + "." + leaf]
    for ours in ("ls1", "ls2"):
        if ours in names:
            out[ours + ".gamma"] = s[h + names[ours]]
    return out


VIT_BLOCK = dict(q="attention.attention.query", k="attention.attention.key", v="attention.attention.value",
                 proj="attention.output.dense", norm1="layernorm_before", norm2="layernorm_after",
                 fc1="intermediate.dense", fc2="output.dense")
DINO_BLOCK = dict(VIT_BLOCK, norm1="norm1", norm2="norm2", fc1="mlp.fc1", fc2="mlp.fc2",
                  ls1="layer_scale1.lambda1", ls2="layer_scale2.lambda1")
# Dinov2SwiGLUFFN's weights_in is [gate; value] (silu on the first half), as timm's SwiGLUPacked fc1
# (GluMlp(gate_last=False): act(x1) * x2); _convert_dinov2 renames w12 -> fc1, w3 -> fc2.
SWIGLU_BLOCK = dict(DINO_BLOCK, fc1="mlp.weights_in", fc2="mlp.weights_out")
TOWER_BLOCK = dict(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", proj="self_attn.out_proj",
                   norm1="layer_norm1", norm2="layer_norm2", fc1="mlp.fc1", fc2="mlp.fc2")


def with_blocks(out, s, prefix, names):
    for i in range(LAYERS):
        out.update({f"blocks.{i}.{k}": v for k, v in fuse(s, f"{prefix}{i}.", names).items()})
    return out


def timm_vit(s):
    """ViTForImageClassification -> timm's VisionTransformer (a non-distilled DeiT)."""
    e = "vit.embeddings."
    out = {"cls_token": s[e + "cls_token"], "pos_embed": s[e + "position_embeddings"],
           "patch_embed.proj.weight": s[e + "patch_embeddings.projection.weight"],
           "patch_embed.proj.bias": s[e + "patch_embeddings.projection.bias"],
           "norm.weight": s["vit.layernorm.weight"], "norm.bias": s["vit.layernorm.bias"],
           "head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]}
    return with_blocks(out, s, "vit.encoder.layer.", VIT_BLOCK)


def timm_deit_distilled(s):
    """DeiTForImageClassificationWithTeacher -> VisionTransformerDistilled: dist_token, pos_embed over
    both prefix tokens, head on the class token, head_dist on the distillation token."""
    e = "deit.embeddings."
    out = {"cls_token": s[e + "cls_token"], "dist_token": s[e + "distillation_token"],
           "pos_embed": s[e + "position_embeddings"],
           "patch_embed.proj.weight": s[e + "patch_embeddings.projection.weight"],
           "patch_embed.proj.bias": s[e + "patch_embeddings.projection.bias"],
           "norm.weight": s["deit.layernorm.weight"], "norm.bias": s["deit.layernorm.bias"],
           "head.weight": s["cls_classifier.weight"], "head.bias": s["cls_classifier.bias"],
           "head_dist.weight": s["distillation_classifier.weight"],
           "head_dist.bias": s["distillation_classifier.bias"]}
    return with_blocks(out, s, "deit.encoder.layer.", VIT_BLOCK)


def timm_dinov2(s, block=DINO_BLOCK):
    """Dinov2Model -> vit_*_patch14_dinov2: pos_embed keeps the class token's row; mask_token dropped."""
    e = "embeddings."
    out = {"cls_token": s[e + "cls_token"], "pos_embed": s[e + "position_embeddings"],
           "patch_embed.proj.weight": s[e + "patch_embeddings.projection.weight"],
           "patch_embed.proj.bias": s[e + "patch_embeddings.projection.bias"],
           "norm.weight": s["layernorm.weight"], "norm.bias": s["layernorm.bias"]}
    return with_blocks(out, s, "encoder.layer.", block)


def timm_dinov2_registers(s):
    """Dinov2WithRegistersModel -> vit_*_reg4_dinov2 (no_embed_class=True), as _convert_dinov2 does:
    reg_token = register_tokens, cls_token = cls_token + pos_embed[:, 0], pos_embed = pos_embed[:, 1:]."""
    out = timm_dinov2(s)
    pos = s["embeddings.position_embeddings"]
    out.update(reg_token=s["embeddings.register_tokens"], cls_token=s["embeddings.cls_token"] + pos[:, :1],
               pos_embed=np.ascontiguousarray(pos[:, 1:]))
    return out


def timm_registers_positioned(s):
    """Dinov2WithRegistersModel as a timm ViT with registers and no_embed_class=False: pos_embed has a
    row X for each register, added to reg_token by timm, so reg_token = register_tokens - X."""
    out = timm_dinov2(s)
    pos, reg = s["embeddings.position_embeddings"], s["embeddings.register_tokens"]
    x = np.random.default_rng(5).normal(size=reg.shape).astype(np.float32)
    out.update(reg_token=reg - x, pos_embed=np.concatenate([pos[:, :1], x, pos[:, 1:]], axis=1))
    return out


def timm_tower(s, prefix=""):
    """The shared part of a SigLIP / CLIP vision tower."""
    e = prefix + "embeddings."
    out = {"patch_embed.proj.weight": s[e + "patch_embedding.weight"],
           "pos_embed": s[e + "position_embedding.weight"][None]}
    if e + "patch_embedding.bias" in s:
        out["patch_embed.proj.bias"] = s[e + "patch_embedding.bias"]
    return with_blocks(out, s, prefix + "encoder.layers.", TOWER_BLOCK)


def timm_siglip(s):
    """SiglipVisionModel -> vit_*_siglip_* (class_token=False, global_pool='map'): the head's
    nn.MultiheadAttention in_proj is [q; k; v]: AttentionPoolLatent's q is its first third, kv the rest."""
    out = timm_tower(s)
    out.update({"norm.weight": s["post_layernorm.weight"], "norm.bias": s["post_layernorm.bias"],
                "attn_pool.latent": s["head.probe"]})
    for leaf, name in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
        packed = s["head.attention." + name]
        out[f"attn_pool.q.{leaf}"], out[f"attn_pool.kv.{leaf}"] = packed[:D], packed[D:]
        out[f"attn_pool.proj.{leaf}"] = s[f"head.attention.out_proj.{leaf}"]
        out[f"attn_pool.norm.{leaf}"] = s[f"head.layernorm.{leaf}"]
        for fc in ("fc1", "fc2"):
            out[f"attn_pool.mlp.{fc}.{leaf}"] = s[f"head.mlp.{fc}.{leaf}"]
    return out


def timm_siglip_gap(s):
    """SiglipVisionModel(vision_use_head=False) -> vit_*_siglip_gap_* (avg pool, fc_norm=False: norm on
    every token, then the mean)."""
    out = timm_tower(s)
    out.update({"norm.weight": s["post_layernorm.weight"], "norm.bias": s["post_layernorm.bias"]})
    return out


FC_NORM = {k: np.random.default_rng(9).normal(size=D).astype(np.float32) for k in ("weight", "bias")}


def timm_fc_norm(s):
    """A gap ViT with fc_norm (timm's default for global_pool='avg'): no norm on the tokens, a LayerNorm
    after the mean (here with its own random weights)."""
    out = timm_tower(s)
    out.update({"fc_norm.weight": FC_NORM["weight"], "fc_norm.bias": FC_NORM["bias"]})
    return out


def timm_clip(s):
    """CLIPVisionModelWithProjection -> vit_*_clip_*: norm_pre, no patch bias, norm on all tokens, the
    visual projection as head.weight with a zero head.bias (_convert_openai_clip)."""
    p = "vision_model." if "vision_model.embeddings.class_embedding" in s else ""  # WithProjection / tower
    out = timm_tower(s, p)
    out.update({"cls_token": s[p + "embeddings.class_embedding"].reshape(1, 1, D),
                "norm_pre.weight": s[p + "pre_layrnorm.weight"], "norm_pre.bias": s[p + "pre_layrnorm.bias"],
                "norm.weight": s[p + "post_layernorm.weight"], "norm.bias": s[p + "post_layernorm.bias"],
                "head.weight": s["visual_projection.weight"],
                "head.bias": np.zeros(s["visual_projection.weight"].shape[0], np.float32)})
    return out


def timm_dinov3(s):
    """DINOv3ViTModel -> timm's Eva (vit_*_dinov3, timm/models/eva.py): cls_token, reg_token (none
    when empty), patch_embed.proj, one fused qkv without a bias (q_bias and v_bias beside it on the
    _qkvb builders; timm's key bias is a buffer, never saved), gamma_1 / gamma_2, the MLP as fc1 /
    fc2 or SwiGLU's fc1_g (gate) / fc1_x / fc2, norm; no pos_embed (rotary positions)."""
    e = "embeddings."
    out = {"cls_token": s[e + "cls_token"], "patch_embed.proj.weight": s[e + "patch_embeddings.weight"],
           "patch_embed.proj.bias": s[e + "patch_embeddings.bias"], "norm.weight": s["norm.weight"],
           "norm.bias": s["norm.bias"]}
    if s[e + "register_tokens"].shape[1]:
        out["reg_token"] = s[e + "register_tokens"]
    for i in range(LAYERS):
        h, b = f"layer.{i}.", f"blocks.{i}."
        out[b + "attn.qkv.weight"] = np.concatenate([s[h + f"attention.{p}_proj.weight"] for p in "qkv"])
        if h + "attention.q_proj.bias" in s:
            out[b + "attn.q_bias"], out[b + "attn.v_bias"] = (s[h + "attention.q_proj.bias"],
                                                              s[h + "attention.v_proj.bias"])
        gated = h + "mlp.gate_proj.weight" in s
        for leaf in ("weight", "bias"):
            out[b + f"attn.proj.{leaf}"] = s[h + f"attention.o_proj.{leaf}"]
            out[b + f"norm1.{leaf}"], out[b + f"norm2.{leaf}"] = s[h + f"norm1.{leaf}"], s[h + f"norm2.{leaf}"]
            if gated:
                out[b + f"mlp.fc1_g.{leaf}"] = s[h + f"mlp.gate_proj.{leaf}"]
                out[b + f"mlp.fc1_x.{leaf}"] = s[h + f"mlp.up_proj.{leaf}"]
            else:
                out[b + f"mlp.fc1.{leaf}"] = s[h + f"mlp.up_proj.{leaf}"]
            out[b + f"mlp.fc2.{leaf}"] = s[h + f"mlp.down_proj.{leaf}"]
        out[b + "gamma_1"], out[b + "gamma_2"] = s[h + "layer_scale1.lambda1"], s[h + "layer_scale2.lambda1"]
    return out


def timm_aimv2(s):
    """Aimv2VisionModel(use_head=False) -> aimv2_*_patch14_* (timm's VisionTransformer with RmsNorm,
    embed_norm_layer, SwiGLU, no qkv / proj / MLP biases, class_token=False, global_pool='avg'): the
    renames of timm's _convert_aimv2 (fc1_g the gate, fc1_x the up projection)."""
    e = "embeddings."
    out = {"patch_embed.proj.weight": s[e + "patch_embed.weight"], "patch_embed.proj.bias": s[e + "patch_embed.bias"],
           "patch_embed.norm.weight": s[e + "rms_norm.weight"], "pos_embed": s[e + "position_embedding.weight"][None],
           "norm.weight": s["rms_norm.weight"]}
    for i in range(LAYERS):
        h, b = f"encoder.layers.{i}.", f"blocks.{i}."
        out[b + "attn.qkv.weight"] = np.concatenate([s[h + f"attention.{p}_proj.weight"] for p in "qkv"])
        out[b + "attn.proj.weight"] = s[h + "attention.out_proj.weight"]
        out[b + "norm1.weight"], out[b + "norm2.weight"] = s[h + "rms_norm1.weight"], s[h + "rms_norm2.weight"]
        out[b + "mlp.fc1_g.weight"], out[b + "mlp.fc1_x.weight"] = s[h + "ffn.gate_proj.weight"], s[h + "ffn.up_proj.weight"]
        out[b + "mlp.fc2.weight"] = s[h + "ffn.down_proj.weight"]
    return out


def timm_siglip2(s):
    """Siglip2VisionModel -> timm's classic vit_*_siglip_*.v2_webli: SigLIP's layout, the patch Linear on
    (row, column, channel) patches as timm's patch convolution."""
    weight = s["embeddings.patch_embedding.weight"]
    patch = int(round((weight.shape[1] // 3) ** 0.5))
    conv = weight.reshape(-1, patch, patch, 3).transpose(0, 3, 1, 2)
    return timm_siglip({**s, "embeddings.patch_embedding.weight": np.ascontiguousarray(conv)})


def mean_of_patches(prefix):
    return lambda hf, x: hf(pixel_values=pixels(x)).last_hidden_state[:, prefix:].mean(1)


HEAD = {"weight": np.random.default_rng(11).normal(size=(CLASSES, D)).astype(np.float32) * 0.3,
        "bias": np.random.default_rng(12).normal(size=CLASSES).astype(np.float32) * 0.3}


def timm_clip_classifier(s):
    """A CLIP tower fine-tuned as a classifier (vit_*_clip_*.*_ft_in1k): a head with a bias."""
    out = timm_clip({**s, "visual_projection.weight": HEAD["weight"]})
    out["head.bias"] = HEAD["bias"]
    return out


# --- transformers' outputs ---

def attribute(name):
    return lambda hf, x: getattr(hf(pixel_values=pixels(x)), name)


def mean_of_last_hidden_state(hf, x):
    return hf(pixel_values=pixels(x)).last_hidden_state.mean(1)


def fc_norm_of_mean(hf, x):
    tokens = hf(pixel_values=pixels(x), output_hidden_states=True).hidden_states[-1]  # before post_layernorm
    return torch.nn.functional.layer_norm(tokens.mean(1), (D,), torch.from_numpy(FC_NORM["weight"]),
                                          torch.from_numpy(FC_NORM["bias"]), eps=1e-6)


def head_on_pooler(hf, x):
    pooled = hf(pixel_values=pixels(x)).pooler_output
    return pooled @ torch.from_numpy(HEAD["weight"]).T + torch.from_numpy(HEAD["bias"])


def siglip_config(**extra):
    return transformers.SiglipVisionConfig(**small(intermediate_size=MLP), **extra)


# name -> (transformers model, its output, timm layout, timm config fields, size, patch,
#          the transformers position table's key and prefix rows (for the resized reference), expected fields)
CASES = {
    "deit_distilled": (
        lambda: transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(
            **small(intermediate_size=MLP), layer_norm_eps=1e-6, num_labels=CLASSES)),
        attribute("logits"), timm_deit_distilled,
        dict(architecture="deit_tiny_distilled_patch4_32", num_classes=CLASSES, label_names=NAMES,
             mean_std=IMAGENET), 32, 4, ("deit.embeddings.position_embeddings", 2),
        dict(classifier="token", distillation_token=True, distillation_head=True, num_heads=HEADS,
             layer_norm_epsilon=1e-6, gelu_approximate=False, pixel_normalization="imagenet",
             position_interpolation="bicubic_antialias")),
    "deit": (
        lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
            **small(28, 7, intermediate_size=MLP), layer_norm_eps=1e-6, num_labels=CLASSES)),
        attribute("logits"), timm_vit,
        dict(architecture="deit_tiny_patch7_28", num_classes=CLASSES, mean_std=IMAGENET), 28, 7,
        ("vit.embeddings.position_embeddings", 1),
        dict(classifier="token", distillation_token=False, pixel_normalization="imagenet",
             position_interpolation="bicubic_antialias")),
    "dinov2": (
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**small(28, 7), mlp_ratio=3)),
        attribute("pooler_output"), timm_dinov2,
        dict(architecture="vit_small_patch14_dinov2", num_classes=0, model_args=dict(num_heads=HEADS),
             mean_std=IMAGENET), 28, 7, ("embeddings.position_embeddings", 1),
        dict(classifier="token", layer_scale_init=1e-5, mlp_dim=3 * D, mlp_activation="gelu",
             num_register_tokens=0, pixel_normalization="imagenet", position_interpolation="bicubic_antialias")),
    "dinov2_giant_swiglu": (
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**small(), use_swiglu_ffn=True,
                                                                   layerscale_value=0.3)),
        attribute("pooler_output"), lambda s: timm_dinov2(s, SWIGLU_BLOCK),
        dict(architecture="vit_giant_patch14_dinov2", num_classes=0, model_args=dict(num_heads=HEADS),
             mean_std=IMAGENET), 32, 4, ("embeddings.position_embeddings", 1),
        dict(mlp_activation="swiglu", mlp_dim=128)),
    "dinov2_registers": (
        lambda: transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(
            **small(), num_register_tokens=3)),
        attribute("pooler_output"), timm_dinov2_registers,
        dict(architecture="vit_small_patch14_reg4_dinov2", num_classes=0, model_args=dict(num_heads=HEADS),
             mean_std=IMAGENET), 32, 4, ("embeddings.position_embeddings", 1),
        dict(classifier="token", num_register_tokens=3, layer_scale_init=1e-5,
             position_interpolation="bicubic_antialias")),
    "registers_positioned": (
        lambda: transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(
            **small(28, 7), num_register_tokens=2)),
        attribute("pooler_output"), timm_registers_positioned,
        dict(architecture="vit_tiny_patch7_reg2_28", num_classes=0, mean_std=IMAGENET), 28, 7,
        ("embeddings.position_embeddings", 1),
        dict(num_register_tokens=2, position_interpolation="bicubic_antialias")),
    "siglip": (  # timm builds vit_base_patch32_siglip_256 with act_layer='gelu_tanh'
        lambda: transformers.SiglipVisionModel(siglip_config()),
        attribute("pooler_output"), timm_siglip,
        dict(architecture="vit_base_patch32_siglip_256", num_classes=0, global_pool="map",
             model_args=dict(num_heads=HEADS), mean_std=HALF), 32, 4, ("embeddings.position_embedding.weight", 0),
        dict(classifier="map", gelu_approximate=True, mlp_activation="gelu", layer_norm_epsilon=1e-6,
             final_norm="tokens", pixel_normalization="minus_one_to_one",
             position_interpolation="bicubic_antialias")),
    "siglip_exact_gelu": (  # ... and vit_base_patch16_siglip_224 with timm's default nn.GELU
        lambda: transformers.SiglipVisionModel(siglip_config(hidden_act="gelu")),
        attribute("pooler_output"), timm_siglip,
        dict(architecture="vit_base_patch16_siglip_224", num_classes=0, global_pool="map",
             model_args=dict(num_heads=HEADS), mean_std=HALF), 32, 4, ("embeddings.position_embedding.weight", 0),
        dict(classifier="map", gelu_approximate=False)),
    "siglip_gap": (
        lambda: transformers.SiglipVisionModel(siglip_config(vision_use_head=False)),
        mean_of_last_hidden_state, timm_siglip_gap,
        dict(architecture="vit_base_patch32_siglip_gap_256", num_classes=0, global_pool="avg",
             model_args=dict(num_heads=HEADS), mean_std=HALF), 32, 4, ("embeddings.position_embedding.weight", 0),
        dict(classifier="gap", final_norm="tokens", gelu_approximate=True,
             position_interpolation="bicubic_antialias")),
    "gap_fc_norm": (
        lambda: transformers.SiglipVisionModel(siglip_config(vision_use_head=False, hidden_act="gelu")),
        fc_norm_of_mean, timm_fc_norm,
        dict(architecture="vit_medium_patch16_gap_256", num_classes=0, global_pool="avg",
             model_args=dict(num_heads=HEADS), mean_std=IMAGENET), 32, 4,
        ("embeddings.position_embedding.weight", 0),
        dict(classifier="gap", final_norm="pooled", gelu_approximate=False, pixel_normalization="imagenet",
             position_interpolation="bicubic_antialias")),
    "clip_quickgelu": (
        lambda: transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(
            **small(intermediate_size=MLP), projection_dim=24)),
        attribute("image_embeds"), timm_clip,
        dict(architecture="vit_base_patch16_clip_quickgelu_224", num_classes=24, model_args=dict(num_heads=HEADS),
             mean_std=CLIP), 32, 4, ("vision_model.embeddings.position_embedding.weight", 1),
        dict(classifier="token", pre_norm=True, patch_bias=False, final_norm="tokens", projection_size=24,
             mlp_activation="quick_gelu", layer_norm_epsilon=1e-5, pixel_normalization="clip",
             position_interpolation="bicubic_antialias")),
    "clip_classifier": (  # vit_base_patch16_clip_224 is timm's exact-GELU CLIP tower
        lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
            **small(28, 7, intermediate_size=MLP), hidden_act="gelu")),
        head_on_pooler, timm_clip_classifier,
        dict(architecture="vit_base_patch16_clip_224", num_classes=CLASSES, label_names=NAMES,
             model_args=dict(num_heads=HEADS), mean_std=CLIP), 28, 7, ("embeddings.position_embedding.weight", 1),
        dict(mlp_activation="gelu", gelu_approximate=False, projection_size=None, layer_norm_epsilon=1e-5)),
    # DINOv3 (timm's Eva): rotary positions, no qkv bias, and timm's default pooling, the mean of the
    # patch tokens after the final norm (the class token and registers attend but are not read).
    "dinov3": (
        lambda: transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
            **small(intermediate_size=MLP), num_register_tokens=3, layerscale_value=0.3, query_bias=False,
            value_bias=False)),
        mean_of_patches(4), timm_dinov3,
        dict(architecture="vit_small_patch16_dinov3", num_classes=0, model_args=dict(num_heads=HEADS),
             mean_std=IMAGENET), 32, 4, None,
        dict(classifier="gap", class_token=True, position_embedding="rope", rope_theta=100.0,
             num_register_tokens=3, layer_scale_init=1e-5, projection_biases=("out", "mlp"),
             layer_norm_epsilon=1e-5, mlp_activation="gelu", pixel_normalization="imagenet")),
    # ... a _qkvb builder's q_bias / v_bias, SwiGLU (S+ and H+), and the class token (global_pool="token",
    # upstream's pooling).
    "dinov3_qkvb_swiglu_token": (
        lambda: transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
            **small(28, 7, intermediate_size=MLP), use_gated_mlp=True, hidden_act="silu")),
        attribute("pooler_output"), timm_dinov3,
        dict(architecture="vit_small_plus_patch16_dinov3_qkvb", num_classes=0, global_pool="token",
             model_args=dict(num_heads=HEADS), mean_std=IMAGENET), 28, 7, None,
        dict(classifier="token", class_token=None, mlp_activation="swiglu", mlp_dim=MLP,
             projection_biases=("query", "key", "value", "out", "mlp"), num_register_tokens=0)),
    # AIMv2 (timm's VisionTransformer with RmsNorm): the mean of every token after the final norm.
    "aimv2": (
        lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**small(28, 7, intermediate_size=MLP),
                                                                             use_head=False)),
        mean_of_last_hidden_state, timm_aimv2,
        dict(architecture="aimv2_large_patch14_224", num_classes=0, model_args=dict(num_heads=HEADS),
             mean_std=CLIP), 28, 7, ("embeddings.position_embedding.weight", 0),
        dict(classifier="gap", norm="rms_norm", patch_norm=True, projection_biases=(), mlp_activation="swiglu",
             layer_norm_epsilon=1e-5, final_norm="tokens", pixel_normalization="clip",
             position_interpolation="bicubic_antialias")),
    # SigLIP2 in timm's classic layout (the table's own grid: HF resizes nothing there).
    "siglip2": (
        lambda: transformers.Siglip2VisionModel(siglip2_vision(patch_size=4, num_patches=64)),
        naflex(4, lambda hf, inputs: hf(**inputs).pooler_output), timm_siglip2,
        dict(architecture="vit_so400m_patch16_siglip_256", num_classes=0, global_pool="map",
             model_args=dict(num_heads=HEADS), mean_std=HALF), 32, 4, None,
        dict(classifier="map", gelu_approximate=True, pixel_normalization="minus_one_to_one",
             position_interpolation="bicubic_antialias")),
}
HAS_HEAD = {"deit_distilled", "deit", "clip_classifier"}


def timm_config(fields, size):
    fields = dict(fields)
    mean, std = fields.pop("mean_std")
    config = {"num_features": D, **fields,
              "pretrained_cfg": {"input_size": [3, size, size], "mean": mean, "std": std, "interpolation": "bicubic"}}
    return config


def build(name, seed=1, positions=1.0):
    torch.manual_seed(0)
    hf = CASES[name][0]().eval()
    perturb_torch(hf, seed)
    with torch.no_grad():
        for param_name, param in hf.named_parameters():
            if param_name.endswith(("position_embeddings", "position_embedding.weight")):
                param.mul_(positions)
    return hf


def saved_timm(tmp_path, name, hf):
    """hf's tensors as save_pretrained writes them (tmp_path/hf), in timm's layout with timm's
    config.json (tmp_path/timm)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(tmp_path / "hf")
    tensors = CASES[name][2](load_file(str(tmp_path / "hf" / "model.safetensors")))
    directory = tmp_path / "timm"
    directory.mkdir()
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(timm_config(CASES[name][3], CASES[name][4])))
    return directory, tensors


def reference(hf, name, x):
    with torch.no_grad():
        return CASES[name][1](hf, x).numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_match_transformers(tmp_path, name):
    hf = build(name)
    directory, _ = saved_timm(tmp_path, name, hf)
    size = CASES[name][4]
    x = images(size)
    want = reference(hf, name, x)
    assert np.abs(want).max() > 0.3  # a real signal
    model = keras_vit.from_pretrained(str(directory))
    for field, value in CASES[name][7].items():
        assert getattr(model.config, field) == value, field
    assert model.include_top == (name in HAS_HEAD) and model.image_size == (size, size)
    np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-4, rtol=0)
    if CASES[name][3].get("label_names"):
        assert model.labels == NAMES


def test_token_layouts(tmp_path):
    # no_embed_class: the class token (position folded in by _convert_dinov2) gets a zero row, the
    # registers none; positioned registers get their row added once.
    hf = build("dinov2_registers")
    _, tensors = saved_timm(tmp_path, "dinov2_registers", hf)
    directory = tmp_path / "timm"
    params = read_timm(directory / "model.safetensors", directory / "config.json").params
    np.testing.assert_array_equal(params[POSEMB_KEY][0, 0], np.zeros(D))
    np.testing.assert_array_equal(params[POSEMB_KEY][0, 1:], tensors["pos_embed"][0])
    np.testing.assert_array_equal(params["cls"], tensors["cls_token"])
    np.testing.assert_array_equal(params["reg_tokens"], tensors["reg_token"])

    hf = build("registers_positioned")
    _, tensors = saved_timm(tmp_path / "positioned", "registers_positioned", hf)
    directory = tmp_path / "positioned" / "timm"
    params = read_timm(directory / "model.safetensors", directory / "config.json").params
    pos = tensors["pos_embed"]
    np.testing.assert_allclose(params["reg_tokens"], tensors["reg_token"] + pos[:, 1:3], rtol=0, atol=1e-7)
    np.testing.assert_array_equal(params[POSEMB_KEY], np.concatenate([pos[:, :1], pos[:, 3:]], axis=1))

    # SwiGLUPacked's fc1 is already [gate; value]: Dense_0 as it is, transposed.
    hf = build("dinov2_giant_swiglu")
    _, tensors = saved_timm(tmp_path / "swiglu", "dinov2_giant_swiglu", hf)
    directory = tmp_path / "swiglu" / "timm"
    params = read_timm(directory / "model.safetensors", directory / "config.json").params
    np.testing.assert_array_equal(params["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"],
                                  tensors["blocks.1.mlp.fc1.weight"].T)


def test_plain_vit_behaviour_is_unchanged(tmp_path):
    # A plain timm ViT keeps the official linear resize and [-1, 1] pixels (its mean/std are 0.5).
    from tests.test_sources_timm import hf_reference, timm_config as plain_config, timm_state, write_timm

    directory = write_timm(tmp_path / "plain", timm_state(hf_reference(), tmp_path), plain_config())
    config = keras_vit.from_pretrained(str(directory)).config
    assert (config.position_interpolation, config.pixel_normalization) == ("linear", "minus_one_to_one")


# --- another size: timm's resample_abs_pos_embed ---

def timm_resample(table, prefix, new_grid):
    """resample_abs_pos_embed: the prefix rows kept, the grid rows through
    F.interpolate(size=new, mode='bicubic', antialias=True) (align_corners False)."""
    table = torch.from_numpy(table)
    rows = table.shape[1] - prefix
    old = int(round(rows ** 0.5))
    grid = table[:, prefix:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    grid = torch.nn.functional.interpolate(grid, size=new_grid, mode="bicubic", antialias=True)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], -1)
    return torch.cat([table[:, :prefix], grid], dim=1).numpy()


def resized_reference(tmp_path, name, hf, size):
    """The transformers model rebuilt at `size`, its position table resized as timm resizes it
    (the grid rows of the transformers table are timm's grid rows in every family)."""
    key, prefix = CASES[name][6]
    directory = tmp_path / "hf"
    tensors = load_file(str(directory / "model.safetensors"))
    table = tensors[key]
    flat = table.ndim == 2
    grid = size // CASES[name][5]
    new = timm_resample(table[None] if flat else table, prefix, (grid, grid))
    tensors[key] = np.ascontiguousarray(new[0] if flat else new)
    out = tmp_path / "hf_resized"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["image_size"] = size
    (out / "config.json").write_text(json.dumps(config))
    return type(hf).from_pretrained(str(out)).eval()


RESIZED = [("deit_distilled", 44), ("dinov2", 42), ("dinov2_registers", 24), ("registers_positioned", 42),
           ("siglip", 44), ("gap_fc_norm", 24), ("clip_quickgelu", 40), ("aimv2", 35)]


@pytest.mark.parametrize("name,size", [("dinov3", (24, 40)), ("dinov3_qkvb_swiglu_token", (35, 21))])
def test_dinov3_at_any_size_and_aspect_ratio(tmp_path, name, size):
    # Rotary positions: no table to resize; one model for every grid, as transformers' (and timm's
    # dynamic_img_size) compute it.
    hf = build(name)
    directory, _ = saved_timm(tmp_path, name, hf)
    model = keras_vit.from_pretrained(str(directory), dynamic_image_size=True)
    for x in (images(size, seed=3), images(CASES[name][4], seed=4)):
        np.testing.assert_allclose(np.asarray(model(x)), reference(hf, name, x), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name,size", RESIZED)
def test_another_size_is_timms_antialiased_bicubic(tmp_path, name, size):
    hf = build(name, positions=5.0)  # larger position tables make the resize count
    directory, _ = saved_timm(tmp_path, name, hf)
    want = reference(resized_reference(tmp_path, name, hf, size), name, images(size, seed=3))
    x = images(size, seed=3)
    resized = keras_vit.from_pretrained(str(directory), image_size=size)
    np.testing.assert_allclose(np.asarray(resized(x)), want, atol=2e-5, rtol=0)
    dynamic = keras_vit.from_pretrained(str(directory), dynamic_image_size=True)
    np.testing.assert_allclose(np.asarray(dynamic(x)), want, atol=2e-5, rtol=0)
    native = images(CASES[name][4], seed=4)
    np.testing.assert_allclose(np.asarray(dynamic(native)), reference(hf, name, native), atol=1e-4, rtol=0)


def test_the_near_miss_rule_is_told_apart(tmp_path):
    # torch's bicubic without antialias (transformers' DeiT / DINOv2 / CLIP / SigLIP rule) is off by more
    # than the tolerance above: the test tells the rules apart.
    name, size = "deit_distilled", 44
    hf = build(name, positions=5.0)
    directory, _ = saved_timm(tmp_path, name, hf)
    x = images(size, seed=3)
    want = reference(resized_reference(tmp_path, name, hf, size), name, x)
    checkpoint = read_timm(directory / "model.safetensors", directory / "config.json")
    from keras_vit.weights.npz import load_checkpoint

    model = keras_vit.ViT(checkpoint.config.replace(position_interpolation="bicubic"), image_size=size,
                          num_classes=CLASSES)
    load_checkpoint(model, checkpoint.params)
    assert np.abs(np.asarray(model(x)) - want).max() > 1e-4


# --- what stays refused ---

def write(tmp_path, tensors, config):
    directory = tmp_path / "refused"
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def case_files(tmp_path, name):
    hf = build(name)
    directory, tensors = saved_timm(tmp_path, name, hf)
    return tensors, json.loads((directory / "config.json").read_text())


def refused(tmp_path, tensors, config, match):
    with pytest.raises(ValueError, match=match) as error:
        keras_vit.from_pretrained(str(write(tmp_path, tensors, config)))
    assert "\n" not in str(error.value)


def test_map_heads_that_read_tokens_differently_are_refused(tmp_path):
    tensors, config = case_files(tmp_path, "siglip")
    # A class token before the patches: timm's MAP head leaves it out, keras-vit's attends over every token.
    with_cls = {**tensors, "cls_token": np.zeros((1, 1, D), np.float32),
                "pos_embed": np.concatenate([np.zeros((1, 1, D), np.float32), tensors["pos_embed"]], axis=1)}
    refused(tmp_path, with_cls, config, "MAP head over the patch tokens only")
    registers = {**tensors, "reg_token": np.ones((1, 2, D), np.float32)}
    refused(tmp_path, registers, config, "MAP head over the patch tokens only")
    # ... unless timm's MAP head reads them too (pool_include_prefix=True, as timm's test_vit3).
    config_prefix = {**config, "model_args": {**config["model_args"], "pool_include_prefix": True}}
    model = keras_vit.from_pretrained(str(write(tmp_path, registers, config_prefix)))
    assert (model.config.classifier, model.config.num_register_tokens) == ("map", 2)
    refused(tmp_path, {**tensors, "attn_pool.latent": np.zeros((1, 2, D), np.float32)}, config, "latent of shape")
    refused(tmp_path, {**tensors, "fc_norm.weight": np.ones(D, np.float32), "fc_norm.bias": np.zeros(D, np.float32)},
            config, "both a final norm and fc_norm")


@pytest.mark.parametrize("change,match", [
    ({"global_pool": "avgmax"}, "global_pool='avgmax'"),
    ({"model_args": {"num_heads": HEADS, "act_layer": "silu"}}, "act_layer='silu'"),
    ({"architecture": "vit_giant_patch14_dinov2"}, None),  # the control: loads
    ({"architecture": "vit_base_patch14_dinov2"}, "packed gated MLP"),
])
def test_what_the_name_or_config_decides(tmp_path, change, match):
    tensors, config = case_files(tmp_path, "dinov2_giant_swiglu")
    config.update(change)
    if match is None:
        assert keras_vit.from_pretrained(str(write(tmp_path, tensors, config))).config.mlp_activation == "swiglu"
    else:
        refused(tmp_path, tensors, config, match)


def test_other_layouts_are_refused_by_name(tmp_path):
    tensors, config = case_files(tmp_path, "deit_distilled")
    headless = {k: v for k, v in tensors.items() if not k.startswith("head")}
    refused(tmp_path, headless, config, "distillation token without its two heads")
    rms = {k: v for k, v in tensors.items() if not (k.startswith("blocks.") and ".norm" in k and k.endswith("bias"))}
    refused(tmp_path, rms, config, "RMSNorm")
    refused(tmp_path, {**tensors, "blocks.0.attn.k_norm.weight": np.ones(16, np.float32)}, config, "QK-norm")
    no_norm = {k: v for k, v in tensors.items() if not k.startswith("norm.")}
    refused(tmp_path, no_norm, config, "no final LayerNorm")
    # CLIP's activation and eps are the architecture's: without timm's config.json they are unknown.
    tensors, _ = case_files(tmp_path / "clip", "clip_quickgelu")
    with pytest.raises(ValueError, match="only timm's config.json names"):
        keras_vit.from_pretrained(str(write(tmp_path / "clip", tensors, None) / "model.safetensors"))


def test_an_input_size_off_the_patch_grid_is_cropped(tmp_path, capsys):
    # vit_so400m_patch14_siglip_384: 384 = 27 * 14 + 6; timm's patch embedding never reads the last 6
    # rows and columns, so the model is 378 wide and the loader says so.
    tensors, config = case_files(tmp_path, "siglip")
    config["pretrained_cfg"]["input_size"] = [3, 35, 35]
    model = keras_vit.from_pretrained(str(write(tmp_path, tensors, config)))
    assert model.image_size == (32, 32) and "crop images to that" in capsys.readouterr().err


def test_the_other_rotary_models_of_timms_eva_are_refused(tmp_path):
    # timm's Eva class also builds naver's RoPE-ViT (vit_*_rope_ape_*: gamma_1/2, a pos_embed, a class
    # token), EVA-02 and PE, whose rotary positions live in buffers no file holds: as a plain ViT they
    # would compute something else. Only DINOv3's builders are read, by their name.
    tensors, config = case_files(tmp_path, "dinov3")
    rope_ape = {**tensors, "pos_embed": np.zeros((1, 65, D), np.float32)}
    refused(tmp_path, rope_ape, {**config, "architecture": "vit_base_patch16_rope_ape_224"},
            "Eva models other than DINOv3")
    with pytest.raises(ValueError, match="DINOv3 is known by the architecture of timm's config.json"):
        keras_vit.from_pretrained(str(write(tmp_path / "bare", tensors, None) / "model.safetensors"))
    # The control: DINOv3 itself, with the rotary periods a converted file may keep (recomputed, not read).
    periods = {**tensors, "rope.periods": np.ones(D // HEADS // 4, np.float32)}
    assert keras_vit.from_pretrained(str(write(tmp_path / "dinov3", periods, config))).config.position_embedding == "rope"


def test_attention_maps_read_the_row_the_output_reads(tmp_path):
    # A class token that only attends (timm's DINOv3 average pooling) is not the row a map shows.
    from keras_vit.inspection.attention import reads_class_token

    for name, reads in (("dinov3", False), ("dinov3_qkvb_swiglu_token", True)):
        directory, _ = saved_timm(tmp_path / name, name, build(name))
        model = keras_vit.from_pretrained(str(directory))
        assert model.class_token is not None and reads_class_token(model) == reads
