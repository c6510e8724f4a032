"""The layers the ViT family adds, each against an independent computation
(numpy, scipy, torch's own attention) and through its config."""

import keras
import numpy as np
import pytest

from keras_vit.layers import (DistillationHead, InsertTokens, LayerScale, MAPHead, MlpBlock, PatchEmbedding,
                              TokenPooling, TokensToMap)
from tests.layers.helpers import assert_config_round_trip


def _weights(layer, rng):
    layer.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32") for w in layer.get_weights()])
    return layer


def test_quick_gelu_and_swiglu_mlps(rng):
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    quick = _weights(MlpBlock(12, activation="quick_gelu"), rng)
    quick.build(x.shape)
    quick = _weights(quick, rng)
    w0, b0, w1, b1 = (np.asarray(w) for w in quick.get_weights())
    h = x @ w0 + b0
    np.testing.assert_allclose(np.asarray(quick(x)), (h / (1 + np.exp(-1.702 * h))) @ w1 + b1, atol=1e-5)
    swiglu = MlpBlock(12, activation="swiglu")
    swiglu.build(x.shape)
    swiglu = _weights(swiglu, rng)
    w0, b0, w1, b1 = (np.asarray(w) for w in swiglu.get_weights())
    assert w0.shape == (8, 24) and w1.shape == (12, 8)
    h = x @ w0 + b0
    gate, value = h[..., :12], h[..., 12:]  # the gate first, as transformers' weights_in rows
    np.testing.assert_allclose(np.asarray(swiglu(x)), (gate / (1 + np.exp(-gate)) * value) @ w1 + b1, atol=1e-5)
    assert_config_round_trip(swiglu, x)
    assert "activation" not in MlpBlock(4).get_config()  # older files' config, unchanged


def test_layer_scale(rng):
    layer = LayerScale(0.25)
    x = rng.normal(size=(2, 3, 6)).astype("float32")
    np.testing.assert_allclose(np.asarray(layer(x)), 0.25 * x, atol=1e-7)
    layer.scale.assign(np.arange(6, dtype="float32"))
    np.testing.assert_allclose(np.asarray(layer(x)), x * np.arange(6), atol=1e-6)
    assert_config_round_trip(layer, x)


def test_insert_tokens_goes_after_the_offset(rng):
    layer = InsertTokens(3, offset=1)
    x = rng.normal(size=(2, 5, 4)).astype("float32")
    out = np.asarray(layer(x))
    tokens = np.asarray(layer.tokens)[0]
    assert out.shape == (2, 8, 4) and len({tuple(t) for t in tokens}) == 3  # three different tokens
    np.testing.assert_array_equal(out[:, 0], x[:, 0])
    np.testing.assert_array_equal(out[:, 1:4], np.broadcast_to(tokens, (2, 3, 4)))
    np.testing.assert_array_equal(out[:, 4:], x[:, 1:])
    assert_config_round_trip(layer, x)


def test_map_head_equals_torch_multihead_attention_pooling(rng):
    torch = pytest.importorskip("torch")
    width, heads, mlp = 12, 3, 20
    head = MAPHead(heads, mlp, layer_norm_epsilon=1e-6, gelu_approximate=True)
    x = rng.normal(size=(2, 7, width)).astype("float32")
    head.build(x.shape)
    _weights(head, rng)
    attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
    q, k, v = (np.asarray(getattr(head, n).kernel).reshape(width, width).T for n in ("query", "key", "value"))
    qb, kb, vb = (np.asarray(getattr(head, n).bias).reshape(width) for n in ("query", "key", "value"))
    with torch.no_grad():
        attention.in_proj_weight.copy_(torch.from_numpy(np.concatenate([q, k, v])))
        attention.in_proj_bias.copy_(torch.from_numpy(np.concatenate([qb, kb, vb])))
        attention.out_proj.weight.copy_(torch.from_numpy(np.asarray(head.out.kernel).reshape(width, width).T))
        attention.out_proj.bias.copy_(torch.from_numpy(np.asarray(head.out.bias)))
        probe = torch.from_numpy(np.broadcast_to(np.asarray(head.probe), (2, 1, width)).copy())
        pooled = attention(probe, torch.from_numpy(x), torch.from_numpy(x))[0].numpy()
    gamma, beta = np.asarray(head.norm.gamma), np.asarray(head.norm.beta)
    normed = (pooled - pooled.mean(-1, keepdims=True)) / np.sqrt(pooled.var(-1, keepdims=True) + 1e-6) * gamma + beta
    hidden = normed @ np.asarray(head.mlp.dense_0.kernel) + np.asarray(head.mlp.dense_0.bias)
    hidden = 0.5 * hidden * (1 + np.tanh(np.sqrt(2 / np.pi) * (hidden + 0.044715 * hidden ** 3)))
    expected = pooled + hidden @ np.asarray(head.mlp.dense_1.kernel) + np.asarray(head.mlp.dense_1.bias)
    np.testing.assert_allclose(np.asarray(head(x)), expected[:, 0], atol=1e-5)
    assert_config_round_trip(head, x)


def test_distillation_head_averages_then_activates(rng):
    head = DistillationHead(4, activation="softmax")
    x = rng.normal(size=(2, 6, 5)).astype("float32")
    head.build(x.shape)
    _weights(head, rng)
    w, b, wd, bd = (np.asarray(a) for a in head.get_weights())
    logits = ((x[:, 0] @ w + b) + (x[:, 1] @ wd + bd)) / 2
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(head(x)), expected, atol=1e-6)
    assert_config_round_trip(head, x)


@pytest.mark.parametrize("classifier, prefix, expected", [
    ("gap", 2, lambda x: x[:, 2:].mean(1)),
    ("token_gap", 3, lambda x: np.concatenate([x[:, 0], x[:, 3:].mean(1)], axis=-1)),
])
def test_pooling_skips_the_prefix(rng, classifier, prefix, expected):
    x = rng.normal(size=(2, 9, 4)).astype("float32")
    layer = TokenPooling(classifier, num_prefix_tokens=prefix)
    np.testing.assert_allclose(np.asarray(layer(x)), expected(x), atol=1e-6)
    assert_config_round_trip(layer, x)


@pytest.mark.parametrize("pad, size, grid", [(False, (8, 12), (2, 3)), (True, (7, 10), (2, 3))])
def test_tokens_to_map_puts_patches_on_their_grid(rng, pad, size, grid):
    tokens = rng.normal(size=(2, 1 + grid[0] * grid[1], 5)).astype("float32")
    images = np.zeros((2, *size, 3), "float32")
    layer = TokensToMap(1, 4, pad=pad)
    np.testing.assert_array_equal(np.asarray(layer(tokens, images)), tokens[:, 1:].reshape(2, *grid, 5))
    clone = TokensToMap.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    np.testing.assert_array_equal(np.asarray(clone(tokens, images)), np.asarray(layer(tokens, images)))


def test_a_patch_embedding_without_bias(rng):
    layer = PatchEmbedding(6, 4, use_bias=False)
    x = rng.normal(size=(1, 8, 8, 3)).astype("float32")
    layer(x)
    assert layer.projection.bias is None and len(layer.weights) == 1
    assert keras.layers.deserialize(keras.layers.serialize(layer)).use_bias is False
    assert "use_bias" not in PatchEmbedding(6, 4).get_config()
