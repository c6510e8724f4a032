"""DINOv3's 2-D rotary position embedding against numpy written from its definition:
each patch's centre in [-1, 1] per axis, d/4 frequencies base^(-4k/d) per axis, and
channel i paired with channel i + d/2 as the real and imaginary parts of a complex
number turned by its angle (a formulation the layer does not use)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.errors import UserError
from keras_vit.layers import EncoderBlock, MultiHeadSelfAttention, RotaryEmbedding2D
from keras_vit.layers.rotary import rotate
from tests.layers import reference


def angles_reference(rows, cols, head_dim, base=100.0):
    """(rows * cols, d/2): the angle of each complex pair of each patch, row-major."""
    quarter = head_dim // 4
    frequencies = base ** (-4.0 * np.arange(quarter) / head_dim)
    out = []
    for r in range(rows):
        for c in range(cols):
            y, x = (r + 0.5) / rows * 2 - 1, (c + 0.5) / cols * 2 - 1
            out.append(np.concatenate([2 * np.pi * y * frequencies, 2 * np.pi * x * frequencies]))
    return np.array(out)


def rotate_reference(x, angles):
    """x (..., P, d): channel i and i + d/2 as one complex number, times exp(i angle)."""
    half = x.shape[-1] // 2
    z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * angles)
    return np.concatenate([z.real, z.imag], axis=-1)


@pytest.mark.parametrize("size, stride, pad", [((24, 40), 8, False), ((20, 36), 8, True)])
def test_angles_match_the_definition(size, stride, pad):
    layer = RotaryEmbedding2D(head_dim=16, stride=stride, pad=pad)
    cos, sin = layer(np.zeros((1, *size, 3), "float32"))
    rows, cols = (-(-size[0] // stride), -(-size[1] // stride)) if pad else (size[0] // stride, size[1] // stride)
    angles = angles_reference(rows, cols, 16)
    np.testing.assert_allclose(np.asarray(cos), np.cos(np.concatenate([angles, angles], -1)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin), np.sin(np.concatenate([angles, angles], -1)), atol=1e-6)


def test_rotation_matches_the_complex_form_and_keeps_norms(rng):
    x = rng.normal(size=(2, 12, 3, 16)).astype("float32")
    cos, sin = RotaryEmbedding2D(16, 4)(np.zeros((1, 12, 16, 3), "float32"))
    turned = np.asarray(rotate(x, cos, sin))
    expected = rotate_reference(x.transpose(0, 2, 1, 3), angles_reference(3, 4, 16)[None, None]).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(turned, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(turned, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_a_query_key_score_depends_on_the_offset_only(rng):
    # Two pairs of patches one row down and two columns right of each other: the same score.
    q, k = rng.normal(size=(2, 1, 1, 1, 8)).astype("float32")
    cos, sin = RotaryEmbedding2D(8, 4)(np.zeros((1, 16, 16, 3), "float32"))
    at = lambda v, patch: np.asarray(rotate(v, cos[patch:patch + 1], sin[patch:patch + 1]))[0, 0, 0]  # noqa: E731
    score = lambda a, b: float(at(q[0], a) @ at(k[0], b))  # noqa: E731
    assert score(0, 6) == pytest.approx(score(5, 11), rel=1e-5)  # (0,0)-(1,2) and (1,1)-(2,3)
    assert score(0, 6) != pytest.approx(score(0, 9), rel=1e-3)  # (0,0)-(2,1): another offset


def test_attention_turns_the_patch_tokens_queries_and_keys_only(rng):
    layer = MultiHeadSelfAttention(num_heads=2, num_prefix_tokens=2)
    x = rng.normal(size=(2, 2 + 6, 16)).astype("float32")
    layer.build(x.shape)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3 for w in layer.get_weights()])
    rope = RotaryEmbedding2D(8, 4)(np.zeros((1, 8, 12, 3), "float32"))  # a 2 x 3 grid
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(v) for sub in (layer.query, layer.key, layer.value, layer.out)
                                      for v in (sub.kernel, sub.bias)]
    q = np.einsum("bnd,dhk->bhnk", x, wq) + bq[None, :, None, :]
    k = np.einsum("bnd,dhk->bhnk", x, wk) + bk[None, :, None, :]
    v = np.einsum("bnd,dhk->bhnk", x, wv) + bv[None, :, None, :]
    angles = angles_reference(2, 3, 8)[None, None]
    q[:, :, 2:], k[:, :, 2:] = rotate_reference(q[:, :, 2:], angles), rotate_reference(k[:, :, 2:], angles)
    probs = reference.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(8))
    expected = np.einsum("bhnk,hkd->bnd", probs @ v, wo) + bo
    np.testing.assert_allclose(np.asarray(layer(x, rope=rope)), expected, atol=1e-4)
    out, scores = layer(x, rope=rope, return_attention_scores=True)  # the explicit path: the same
    np.testing.assert_allclose(np.asarray(scores), probs, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4)


def test_a_rematerialised_block_turns_the_same_and_gives_the_same_gradients(rng):
    x = tf.constant(rng.normal(size=(2, 1 + 6, 16)).astype("float32"))
    rope = RotaryEmbedding2D(8, 4)(np.zeros((1, 8, 12, 3), "float32"))
    results, weights = [], None
    for rematerialize in (False, True):
        block = EncoderBlock(num_heads=2, mlp_dim=32, num_prefix_tokens=1)
        block.build(x.shape)
        weights = weights or [np.asarray(w) + rng.normal(scale=0.1, size=w.shape).astype("float32")
                              for w in block.get_weights()]
        block.set_weights(weights)
        block.rematerialize = rematerialize
        with tf.GradientTape() as tape:
            y = block(x, training=True, rope=rope)
            loss = tf.reduce_sum(y * tf.sin(y))
        results.append((np.asarray(y), [np.asarray(g) for g in tape.gradient(loss, block.trainable_variables)]))
    np.testing.assert_allclose(results[1][0], results[0][0], atol=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert not np.allclose(results[0][0], np.asarray(block(x)), atol=1e-3)  # the angles change the block's output


def test_config_round_trip_and_the_models_refusals():
    layer = RotaryEmbedding2D(head_dim=12, stride=14, base=50.0, pad=True, name="rope")
    config = layer.get_config()
    clone = RotaryEmbedding2D.from_config(config)
    assert clone.get_config() == config
    images = np.zeros((1, 30, 44, 3), "float32")
    for a, b in zip(layer(images), clone(images)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is RotaryEmbedding2D and restored.get_config() == config
    base = dict(patch_size=4, hidden_size=24, mlp_dim=32, num_heads=2, num_layers=1, position_embedding="rope")
    with pytest.raises(UserError, match="head width hidden_size/num_heads = 6 must be divisible by 4"):
        keras_vit.ViTConfig(**dict(base, hidden_size=12))
    with pytest.raises(UserError, match=r"rotary angles \(position_embedding='rope', DINOv3's\) .*use patch_dropout=0\."):
        keras_vit.ViTConfig(**base, patch_dropout=0.5)


def test_training_moves_the_coordinates_as_dinov3_s_augmentation():
    # transformers' augment_patches_center_coordinates: shift (a uniform per axis), jitter (a
    # log-uniform factor per axis), rescale (one log-uniform factor for both), one draw per call;
    # inference never moves them.
    images = np.zeros((2, 32, 48, 3), "float32")  # 4 x 6 patches: no centre at 0, so the factors show
    plain = np.asarray(RotaryEmbedding2D(16, 8).coordinates(images))
    np.testing.assert_allclose(plain, angles_reference(4, 6, 4)[:, [0, 1]] / (2 * np.pi), atol=1e-6)  # (row, column)
    cases = {"shift": 0.3, "jitter": 1.5, "rescale": 2.0}
    draws = {name: [] for name in cases}
    for name, spread in cases.items():
        layer = RotaryEmbedding2D(16, 8, seed=3, **{name: spread})
        np.testing.assert_array_equal(np.asarray(layer.coordinates(images)), plain)
        cos, sin = layer(images)
        np.testing.assert_array_equal(np.asarray(cos), np.asarray(RotaryEmbedding2D(16, 8)(images)[0]))
        for _ in range(20):
            moved = np.asarray(layer.coordinates(images, training=True))
            change = moved - plain if name == "shift" else moved / plain
            np.testing.assert_allclose(change, np.broadcast_to(change[:1], change.shape), rtol=1e-5, atol=1e-6)
            draws[name].append(change[0])
    shifts, jitters, rescales = (np.array(draws[name]) for name in ("shift", "jitter", "rescale"))
    assert np.all(np.abs(shifts) <= 0.3) and np.ptp(shifts[:, 0]) > 0.1 and np.ptp(shifts[:, 1]) > 0.1
    assert not np.allclose(shifts[:, 0], shifts[:, 1])  # each axis its own draw
    assert np.all((jitters >= 1 / 1.5 - 1e-6) & (jitters <= 1.5 + 1e-6)) and not np.allclose(jitters[:, 0], jitters[:, 1])
    assert np.all((rescales >= 0.5 - 1e-6) & (rescales <= 2 + 1e-6)) and np.ptp(rescales[:, 0]) > 0.3
    np.testing.assert_allclose(rescales[:, 0], rescales[:, 1], rtol=1e-6)  # one factor for both axes
    assert np.mean(np.log(rescales[:, 0]) < 0) > 0.2 and np.mean(np.log(rescales[:, 0]) > 0) > 0.2  # log-uniform


def test_a_dinov3_checkpoint_s_augmentation_trains_and_leaves_inference_alone():
    config = keras_vit.ViTConfig(4, 24, 40, 3, 1, position_embedding="rope", rope_rescale=2.0, rope_jitter=1.2)
    model = keras_vit.ViT(config, image_size=16, num_classes=3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    keras.utils.set_random_seed(1)
    model.set_weights([w + np.random.default_rng(1).normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(model(x)))
    assert np.abs(np.asarray(model(x, training=True)) - np.asarray(model(x, training=True))).max() > 1e-4
    restored = keras_vit.ViT.from_config(model.get_config())
    assert restored.rotary_embedding.rescale == 2.0 and restored.rotary_embedding.jitter == 1.2
    with pytest.raises(ValueError, match="rope_rescale augment rotary positions: set position_embedding='rope'"):
        keras_vit.ViTConfig(4, 24, 40, 3, 1, rope_rescale=2.0)
    with pytest.raises(ValueError, match="rope_jitter must be None or at least 1"):
        keras_vit.ViTConfig(4, 24, 40, 3, 1, position_embedding="rope", rope_jitter=0.5)
