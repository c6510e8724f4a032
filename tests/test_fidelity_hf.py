"""Fidelity against an independent implementation: HF transformers' PyTorch
ViT. Its weights are converted to the official .npz layout here (HF's own
documented naming, not our layout code), loaded through keras_vit's strict
loader, and the outputs compared."""

import numpy as np
import pytest
import torch
import transformers

import keras_vit
from tests.conftest import tiny_config


def hf_to_official(state, num_layers, num_heads):
    """Maps an HF ViT state dict to official Flax keys and layouts."""
    t = {k: v.detach().numpy().astype(np.float32) for k, v in state.items()}
    d = t["vit.embeddings.cls_token"].shape[-1]
    k = d // num_heads
    p = {
        "cls": t["vit.embeddings.cls_token"],
        "Transformer/posembed_input/pos_embedding": t["vit.embeddings.position_embeddings"],
        # torch conv (out, in, kh, kw) -> (kh, kw, in, out)
        "embedding/kernel": t["vit.embeddings.patch_embeddings.projection.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": t["vit.embeddings.patch_embeddings.projection.bias"],
        "Transformer/encoder_norm/scale": t["vit.layernorm.weight"],
        "Transformer/encoder_norm/bias": t["vit.layernorm.bias"],
    }
    for i in range(num_layers):
        # transformers 5 names (4.x had encoder.layer.{i}.attention.attention.query ...).
        h, o = f"vit.layers.{i}.", f"Transformer/encoderblock_{i}/"
        a = o + "MultiHeadDotProductAttention_1/"
        for name, hf_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            # torch Linear (out, in): y = x W^T + b; out splits as (heads, head_dim)
            p[a + f"{name}/kernel"] = t[h + f"attention.{hf_name}.weight"].T.reshape(d, num_heads, k)
            p[a + f"{name}/bias"] = t[h + f"attention.{hf_name}.bias"].reshape(num_heads, k)
        p[a + "out/kernel"] = t[h + "attention.o_proj.weight"].T.reshape(num_heads, k, d)
        p[a + "out/bias"] = t[h + "attention.o_proj.bias"]
        p[o + "LayerNorm_0/scale"], p[o + "LayerNorm_0/bias"] = t[h + "layernorm_before.weight"], t[h + "layernorm_before.bias"]
        p[o + "LayerNorm_2/scale"], p[o + "LayerNorm_2/bias"] = t[h + "layernorm_after.weight"], t[h + "layernorm_after.bias"]
        p[o + "MlpBlock_3/Dense_0/kernel"] = t[h + "mlp.fc1.weight"].T
        p[o + "MlpBlock_3/Dense_0/bias"] = t[h + "mlp.fc1.bias"]
        p[o + "MlpBlock_3/Dense_1/kernel"] = t[h + "mlp.fc2.weight"].T
        p[o + "MlpBlock_3/Dense_1/bias"] = t[h + "mlp.fc2.bias"]
    if "classifier.weight" in t:
        p["head/kernel"], p["head/bias"] = t["classifier.weight"].T, t["classifier.bias"]
    if "vit.pooler.dense.weight" in t:
        p["pre_logits/kernel"], p["pre_logits/bias"] = t["vit.pooler.dense.weight"].T, t["vit.pooler.dense.bias"]
    return p


def hf_config(config, image_size, num_labels=None):
    return transformers.ViTConfig(
        hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.mlp_dim,
        hidden_act="gelu_pytorch_tanh",  # the official code's tanh-approximate GELU
        layer_norm_eps=1e-6, image_size=image_size, patch_size=config.patch_size, num_channels=3,
        qkv_bias=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        **({"num_labels": num_labels} if num_labels else {}),
    )


def randomise(module, seed):
    # HF initialises biases and LayerNorms to constants; random values test the mapping of each.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)


@pytest.mark.parametrize("image_size,patch,heads", [(16, 4, 4), (32, 8, 2)])
def test_logits_match_hf_transformers(rng, image_size, patch, heads):
    config = tiny_config(patch_size=patch, num_heads=heads, num_layers=3)
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(hf_config(config, image_size, num_labels=10)).eval()
    randomise(hf, 1)
    params = hf_to_official(hf.state_dict(), config.num_layers, heads)
    model = keras_vit.ViT(config, image_size=image_size, num_classes=10, weights=params)
    images = rng.uniform(-1, 1, size=(4, image_size, image_size, 3)).astype(np.float32)
    with torch.no_grad():
        expected = hf(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).logits.numpy()
    ours = np.asarray(model(images))
    assert np.abs(expected).max() > 0.5  # a real signal, not zeros
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)


def test_representation_matches_hf_pooler(rng):
    config = tiny_config(representation_size=32)
    hf = transformers.ViTModel(hf_config(config, 16), add_pooling_layer=True).eval()
    randomise(hf, 2)
    state = {"vit." + k: v for k, v in hf.state_dict().items()}
    params = hf_to_official(state, config.num_layers, config.num_heads)
    model = keras_vit.ViT(config, image_size=16, include_top=False, weights=params)
    images = rng.uniform(-1, 1, size=(3, 16, 16, 3)).astype(np.float32)
    with torch.no_grad():
        expected = hf(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).pooler_output.numpy()
    np.testing.assert_allclose(np.asarray(model(images)), expected, atol=1e-4, rtol=0)
