"""timm ViT checkpoints. timm itself cannot be imported here (it needs a CUDA
torchvision), so the test writes timm's layout from timm's documented names
(timm/models/vision_transformer.py: fused blocks.N.attn.qkv, cls_token,
pos_embed, patch_embed.proj, norm, head) out of a perturbed HF transformers
ViT, and checks the loaded model against transformers' logits: an
independent implementation with timm's numerics (exact GELU, eps 1e-6)."""

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import keras_vit
from tests.sources_helpers import perturb_torch, photos, torch_logits

SIZE = 32


def hf_reference(num_labels=5):
    config = transformers.ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96,
                                    image_size=SIZE, patch_size=8, layer_norm_eps=1e-6, num_labels=num_labels)
    hf = transformers.ViTForImageClassification(config).eval()
    perturb_torch(hf, 7, scale=0.3)
    return hf


def timm_state(hf, tmp_path):
    """HF's tensors (as its save_pretrained writes them) under timm's names (timm's own layout, written from
    its documented names)."""
    hf.save_pretrained(tmp_path / "hf_source")
    s = load_file(str(tmp_path / "hf_source" / "model.safetensors"))
    out = {
        "cls_token": s["vit.embeddings.cls_token"],
        "pos_embed": s["vit.embeddings.position_embeddings"],
        "patch_embed.proj.weight": s["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": s["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": s["vit.layernorm.weight"], "norm.bias": s["vit.layernorm.bias"],
        "head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"],
    }
    for i in range(hf.config.num_hidden_layers):
        h, t = f"vit.encoder.layer.{i}.", f"blocks.{i}."
        att = h + "attention.attention."
        for leaf in ("weight", "bias"):
            out[t + f"attn.qkv.{leaf}"] = np.concatenate([s[att + f"{n}.{leaf}"] for n in ("query", "key", "value")])
            out[t + f"attn.proj.{leaf}"] = s[h + f"attention.output.dense.{leaf}"]
            out[t + f"norm1.{leaf}"] = s[h + f"layernorm_before.{leaf}"]
            out[t + f"norm2.{leaf}"] = s[h + f"layernorm_after.{leaf}"]
            out[t + f"mlp.fc1.{leaf}"] = s[h + f"intermediate.dense.{leaf}"]
            out[t + f"mlp.fc2.{leaf}"] = s[h + f"output.dense.{leaf}"]
    return out


def timm_config(**overrides):
    config = {"architecture": "vit_tiny_patch8_32", "num_classes": 5, "num_features": 48, "global_pool": "token",
              "pretrained_cfg": {"input_size": [3, SIZE, SIZE], "mean": [0.5] * 3, "std": [0.5] * 3},
              "label_names": ["a", "b", "c", "d", "e"]}
    config.update(overrides)
    return config


def write_timm(directory, tensors, config=None):
    directory.mkdir(exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_timm_checkpoint_loads_with_the_reference_logits(tmp_path):
    hf = hf_reference()
    directory = write_timm(tmp_path / "timm", timm_state(hf, tmp_path), timm_config())
    images = photos(SIZE)
    expected = torch_logits(hf, images)
    for source in (directory, directory / "model.safetensors"):
        model = keras_vit.from_pretrained(str(source))
        assert model.config.num_heads == 3 and model.config.gelu_approximate is False
        assert model.config.layer_norm_epsilon == 1e-6 and model.labels == ["a", "b", "c", "d", "e"]
        np.testing.assert_allclose(np.asarray(model(images)), expected, atol=1e-4, rtol=0)


def test_without_config_an_unknown_size_asks_for_it(tmp_path):
    # Heads cannot be read from shapes: without timm's config.json (its architecture name) only the sizes of
    # the variant table are recognised, and this width-48 model is not one of them.
    tensors = timm_state(hf_reference(), tmp_path)
    path = write_timm(tmp_path / "bare", tensors) / "model.safetensors"
    with pytest.raises(ValueError, match="cannot tell the number of attention heads.*config.json"):
        keras_vit.from_pretrained(str(path))


# Registers, distillation tokens, layer scale, fc_norm and the other family layouts load
# (tests/test_timm_families.py); these still cannot be expressed.
@pytest.mark.parametrize("extra,match", [
    ({"blocks.0.attn.q_norm.weight": np.ones(16, np.float32)}, "QK-norm"),
    ({"blocks.1.mlp.norm.weight": np.ones(96, np.float32)}, "scale_mlp_norm"),
    ({"blocks.0.attn.lambda_q1": np.ones(16, np.float32)}, "differential attention"),
    ({"dist_token": np.zeros((1, 1, 48), np.float32)}, "distillation token without its two heads"),
    ({"patch_embed.backbone.stem.conv.weight": np.zeros((64, 3, 7, 7), np.float32)}, "a hybrid"),
    ({"fc_norm.weight": np.ones(48, np.float32)}, "both a final norm and fc_norm"),
])
def test_layouts_that_cannot_be_expressed_are_refused_by_name(tmp_path, extra, match):
    tensors = {**timm_state(hf_reference(), tmp_path), **extra}
    directory = write_timm(tmp_path / "timm", tensors, timm_config())
    with pytest.raises(ValueError, match=match + ".*cannot be loaded without changing its outputs"):
        keras_vit.from_pretrained(str(directory))


def test_qkv_without_bias_loads_as_projections_without_one(tmp_path):
    # timm's qkv_bias=False (DINOv3's and AIMv2's builders): query/key/value without a bias
    # (ViTConfig.projection_biases), the model transformers computes with those biases at zero.
    hf = hf_reference()
    with torch.no_grad():  # transformers 5's in-memory names (q_proj, ...) or 4's (query, ...)
        zeroed = [p.zero_() for name, p in hf.named_parameters()
                  if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias", "query.bias", "key.bias", "value.bias"))]
    assert len(zeroed) == 3 * hf.config.num_hidden_layers
    tensors = {k: v for k, v in timm_state(hf, tmp_path).items() if not k.endswith("attn.qkv.bias")}
    model = keras_vit.from_pretrained(str(write_timm(tmp_path / "timm", tensors, timm_config())))
    assert model.config.projection_biases == ("out", "mlp")
    images = photos(SIZE)
    np.testing.assert_allclose(np.asarray(model(images)), torch_logits(hf, images), atol=1e-4, rtol=0)


