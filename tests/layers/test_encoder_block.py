import numpy as np

from keras_vit.layers import EncoderBlock
from tests.layers import reference
from tests.layers.helpers import assert_config_round_trip


def block_params(block):
    a = block.attention
    return {
        "ln0_scale": np.asarray(block.attention_norm.gamma), "ln0_bias": np.asarray(block.attention_norm.beta),
        "ln2_scale": np.asarray(block.mlp_norm.gamma), "ln2_bias": np.asarray(block.mlp_norm.beta),
        "attention": [np.asarray(v) for s in (a.query, a.key, a.value, a.out) for v in (s.kernel, s.bias)],
        "mlp": [np.asarray(v) for v in (block.mlp.dense_0.kernel, block.mlp.dense_0.bias,
                                        block.mlp.dense_1.kernel, block.mlp.dense_1.bias)],
    }


def randomise(layer, rng, scale=0.3):
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * scale + (1.0 if "gamma" in v.path else 0.0)
                       for w, v in zip(layer.get_weights(), layer.weights)])


def test_pre_layernorm_block_matches_reference(rng):
    block = EncoderBlock(num_heads=4, mlp_dim=64)
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    block.build(x.shape)
    randomise(block, rng)
    np.testing.assert_allclose(np.asarray(block(x)), reference.encoder_block(x, block_params(block)),
                               rtol=1e-4, atol=1e-4)


def test_layer_norm_epsilon_is_the_official_one():
    block = EncoderBlock(num_heads=2, mlp_dim=8)
    assert block.attention_norm.epsilon == block.mlp_norm.epsilon == 1e-6


def test_returns_attention_probabilities(rng):
    block = EncoderBlock(num_heads=2, mlp_dim=8)
    x = rng.normal(size=(1, 4, 8)).astype("float32")
    y, probs = block(x, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(y), np.asarray(block(x)), rtol=1e-5, atol=1e-6)
    assert probs.shape == (1, 2, 4, 4)


def test_config_round_trip(rng):
    assert_config_round_trip(EncoderBlock(2, 16, dropout_rate=0.1, attention_dropout_rate=0.1,
                                          stochastic_depth_rate=0.1),
                             rng.normal(size=(2, 3, 8)).astype("float32"))
