import numpy as np
import pytest

from keras_vit.layers import MultiHeadSelfAttention
from tests.layers import reference
from tests.layers.helpers import assert_config_round_trip


def _weights(layer):
    return [np.asarray(v) for sub in (layer.query, layer.key, layer.value, layer.out)
            for v in (sub.kernel, sub.bias)]


def test_official_weight_shapes():
    layer = MultiHeadSelfAttention(num_heads=4)
    layer.build((None, 5, 32))
    assert tuple(layer.query.kernel.shape) == (32, 4, 8)
    assert tuple(layer.query.bias.shape) == (4, 8)
    assert tuple(layer.out.kernel.shape) == (4, 8, 32)
    assert tuple(layer.out.bias.shape) == (32,)


@pytest.mark.parametrize("return_scores", [False, True])
def test_matches_numpy_reference(rng, return_scores):
    layer = MultiHeadSelfAttention(num_heads=4)
    x = rng.normal(size=(2, 7, 32)).astype("float32")
    layer.build(x.shape)
    # Random biases too (the initialiser gives zeros, which would hide a bias bug).
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3 for w in layer.get_weights()])
    expected, expected_probs = reference.attention(x, *_weights(layer))
    if return_scores:
        out, probs = layer(x, return_attention_scores=True)
        assert probs.shape == (2, 4, 7, 7)
        np.testing.assert_allclose(np.asarray(probs), expected_probs, rtol=1e-4, atol=1e-5)
    else:
        out = layer(x)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-4)


def test_fast_and_explicit_paths_agree(rng):
    layer = MultiHeadSelfAttention(num_heads=2)
    x = rng.normal(size=(3, 9, 16)).astype("float32")
    fast = np.asarray(layer(x))
    explicit, probs = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(fast, np.asarray(explicit), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-5)


def test_attention_dropout_only_in_training(rng):
    layer = MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.5)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    np.testing.assert_allclose(np.asarray(layer(x, training=False)), np.asarray(layer(x)), rtol=1e-6)
    assert not np.allclose(np.asarray(layer(x, training=True)), np.asarray(layer(x)))


def test_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        MultiHeadSelfAttention(num_heads=3).build((None, 4, 32))


def test_config_round_trip(rng):
    assert_config_round_trip(MultiHeadSelfAttention(4, attention_dropout_rate=0.1),
                             rng.normal(size=(2, 5, 32)).astype("float32"))
