import keras
import numpy as np
import pytest

from keras_vit.layers.patch_corruption import KEPT, MASKED, RANDOM, PatchCorruption


def _distinct_tokens(batch, num_tokens, width):
    # Every token of every image is different, so a copied token can be traced back to its position.
    return np.arange(batch * num_tokens * width, dtype="float32").reshape(batch, num_tokens, width) + 1.0


def test_outputs_follow_the_kinds():
    layer = PatchCorruption(seed=3)
    tokens = _distinct_tokens(4, 16, 6)
    out, corrupted, kinds = (keras.ops.convert_to_numpy(t) for t in layer(tokens))
    mask = keras.ops.convert_to_numpy(layer.mask_embedding)
    assert out.shape == tokens.shape and corrupted.shape == kinds.shape == (4, 16)
    np.testing.assert_array_equal(corrupted.sum(1), 8)  # exactly half of each image
    assert np.all(kinds[corrupted == 0] == KEPT)
    np.testing.assert_array_equal(out[kinds == KEPT], tokens[kinds == KEPT])
    np.testing.assert_array_equal(out[kinds == MASKED], np.broadcast_to(mask, out[kinds == MASKED].shape))
    for b, i in zip(*np.nonzero(kinds == RANDOM)):
        (source,) = np.nonzero(np.all(tokens[b] == out[b, i], axis=-1))[0]
        assert source != i


def test_same_seed_same_draws_and_config_round_trip():
    tokens = _distinct_tokens(2, 9, 4)
    layer = PatchCorruption(corrupt_rate=0.4, mask_rate=0.7, random_rate=0.2, seed=11, name="corrupt")
    layer.build(tokens.shape)
    config = layer.get_config()
    clone = PatchCorruption.from_config(config)
    assert clone.get_config() == config
    clone.build(tokens.shape)
    clone.set_weights(layer.get_weights())
    for _ in range(2):  # the same stream, call after call
        for a, b in zip(layer(tokens), clone(tokens)):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is PatchCorruption and restored.get_config() == config


def test_mask_embedding_is_learnable_and_gets_a_gradient():
    import tensorflow as tf

    layer = PatchCorruption(mask_rate=1.0, random_rate=0.0, seed=0)
    tokens = tf.constant(_distinct_tokens(2, 8, 4))
    layer.build(tokens.shape)
    assert [w.name for w in layer.trainable_weights] == ["mask_embedding"]
    with tf.GradientTape() as tape:
        out, corrupted, _ = layer(tokens)
        loss = tf.reduce_sum(out)
    (grad,) = tape.gradient(loss, layer.trainable_weights)
    np.testing.assert_allclose(grad.numpy(), np.full(4, 8.0))  # 4 masked tokens in each of 2 images


def test_rejects_bad_rates():
    with pytest.raises(ValueError, match="corrupt_rate"):
        PatchCorruption(corrupt_rate=0.0)
    with pytest.raises(ValueError, match="sum"):
        PatchCorruption(mask_rate=0.8, random_rate=0.3)
