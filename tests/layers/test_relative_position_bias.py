import numpy as np
import pytest

from keras_vit.layers import MultiHeadSelfAttention, RelativePositionBias
from tests.layers import reference
from tests.layers.helpers import assert_config_round_trip


def numpy_bias(table, prefix_bias, grid, prefix):
    """(heads, T, T) by looping over every pair of tokens."""
    rows, cols = grid
    heads = table.shape[0]
    positions = [None] * prefix + [(r, c) for r in range(rows) for c in range(cols)]
    out = np.zeros((heads, len(positions), len(positions)), np.float32)
    for i, query in enumerate(positions):
        for j, key in enumerate(positions):
            if query is not None and key is not None:
                out[:, i, j] = table[:, query[0] - key[0] + rows - 1, query[1] - key[1] + cols - 1]
            elif query is None and key is None:
                out[:, i, j] = prefix_bias[:, 2]  # class token -> itself
            elif query is None:
                out[:, i, j] = prefix_bias[:, 0]  # class token -> patch
            else:
                out[:, i, j] = prefix_bias[:, 1]  # patch -> class token
    return out


def _randomise(layer, rng):
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()])


@pytest.mark.parametrize("prefix", [0, 1])
def test_bias_per_head_and_offset(rng, prefix):
    grid = (2, 3)
    layer = RelativePositionBias(num_heads=2, grid_size=grid, num_prefix_tokens=prefix)
    tokens = np.zeros((1, prefix + 6, 4), np.float32)
    layer.build(tokens.shape)
    assert tuple(layer.relative_bias.shape) == (2, 3, 5)
    assert np.all(np.asarray(layer.relative_bias) == 0)  # starts position-free
    _randomise(layer, rng)
    prefix_bias = np.asarray(layer.prefix_bias) if prefix else np.zeros((2, 3), np.float32)
    expected = numpy_bias(np.asarray(layer.relative_bias), prefix_bias, grid, prefix)
    out = np.asarray(layer(tokens))
    assert out.shape == (1, 2, prefix + 6, prefix + 6)
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)


def test_same_offset_same_bias(rng):
    layer = RelativePositionBias(num_heads=1, grid_size=(3, 3))
    tokens = np.zeros((1, 9, 4), np.float32)
    layer.build(tokens.shape)
    _randomise(layer, rng)
    bias = np.asarray(layer(tokens))[0, 0]
    # (0,0)->(1,1) and (1,1)->(2,2) are the same offset; (0,0)->(0,0) is offset 0 like every diagonal entry.
    assert bias[0, 4] == bias[4, 8]
    np.testing.assert_allclose(np.diag(bias), bias[0, 0])


@pytest.mark.parametrize("return_scores", [False, True])
def test_attention_adds_the_bias_to_its_logits(rng, return_scores):
    grid, prefix = (2, 2), 1
    layer = MultiHeadSelfAttention(num_heads=2, relative_position_grid=grid, num_prefix_tokens=prefix)
    x = rng.normal(size=(2, prefix + 4, 8)).astype("float32")
    layer.build(x.shape)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5 for w in layer.get_weights()])
    relative = layer.relative_position_bias
    bias = numpy_bias(np.asarray(relative.relative_bias), np.asarray(relative.prefix_bias), grid, prefix)
    weights = [np.asarray(v) for sub in (layer.query, layer.key, layer.value, layer.out)
               for v in (sub.kernel, sub.bias)]
    expected, expected_probs = reference.attention(x, *weights, logit_bias=bias)
    if return_scores:  # the explicit path
        out, probs = layer(x, return_attention_scores=True)
        np.testing.assert_allclose(np.asarray(probs), expected_probs, rtol=1e-4, atol=1e-5)
    else:  # keras.ops.dot_product_attention(bias=...)
        out = layer(x)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-4)
    # And the bias matters: without it the output differs.
    without, _ = reference.attention(x, *weights)
    assert not np.allclose(np.asarray(out), without, atol=1e-3)


def test_wrong_token_count():
    with pytest.raises(ValueError, match=r"0 prefix token\(s\) and a 2x2 grid \(4 tokens\) but got 5"):
        RelativePositionBias(2, (2, 2)).build((None, 5, 8))


def test_config_round_trip(rng):
    assert_config_round_trip(RelativePositionBias(2, (2, 3), num_prefix_tokens=1),
                             rng.normal(size=(2, 7, 8)).astype("float32"))
    assert_config_round_trip(MultiHeadSelfAttention(2, relative_position_grid=(2, 3), num_prefix_tokens=1),
                             rng.normal(size=(2, 7, 8)).astype("float32"))
