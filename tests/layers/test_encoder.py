import numpy as np

from keras_vit.layers import Encoder
from tests.layers import reference
from tests.layers.helpers import assert_config_round_trip
from tests.layers.test_encoder_block import block_params, randomise


def test_blocks_then_final_norm(rng):
    encoder = Encoder(num_layers=3, num_heads=2, mlp_dim=16)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    encoder.build(x.shape)
    randomise(encoder, rng)
    expected = x
    for block in encoder.blocks:
        expected = reference.encoder_block(expected, block_params(block))
    norm = encoder.encoder_norm
    expected = reference.layer_norm(expected, np.asarray(norm.gamma), np.asarray(norm.beta))
    np.testing.assert_allclose(np.asarray(encoder(x)), expected, rtol=1e-4, atol=1e-4)
    assert [b.name for b in encoder.blocks] == ["encoderblock_0", "encoderblock_1", "encoderblock_2"]


def test_attention_scores_per_block(rng):
    encoder = Encoder(num_layers=3, num_heads=2, mlp_dim=16)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    y, scores = encoder(x, return_attention_scores=True)
    assert len(scores) == 3 and all(s.shape == (2, 2, 5, 5) for s in scores)
    np.testing.assert_allclose(np.asarray(y), np.asarray(encoder(x)), rtol=1e-5, atol=1e-5)


def test_stochastic_depth_grows_linearly():
    encoder = Encoder(num_layers=5, num_heads=2, mlp_dim=16, stochastic_depth_rate=0.2)
    np.testing.assert_allclose([b.stochastic_depth_rate for b in encoder.blocks], [0, 0.05, 0.1, 0.15, 0.2])


def test_config_round_trip(rng):
    assert_config_round_trip(Encoder(2, 2, 16, 0.1, 0.1, 0.1), rng.normal(size=(2, 3, 8)).astype("float32"))
