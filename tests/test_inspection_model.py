"""Inspection read from real (tiny) models: the arrays agree with the model itself."""

import keras
import numpy as np
import pytest

from keras_vit import ResNetConfig, ViT, ViTConfig
from keras_vit import inspection

TINY = ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2)


def random_pixels(n, size, channels, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, channels)).astype(np.uint8)


def randomise_head(model, seed=0):
    # The head is zero-initialised (fine-tuning convention): give it weights
    # so that logits depend on the tokens.
    kernel = np.random.default_rng(seed).normal(size=model.head.kernel.shape).astype("float32")
    model.head.kernel.assign(kernel)


@pytest.fixture(scope="module")
def token_model():
    keras.utils.set_random_seed(0)
    model = ViT(TINY, image_size=28, num_classes=10, num_channels=1)
    randomise_head(model)
    return model


@pytest.fixture(scope="module")
def gap_model():
    keras.utils.set_random_seed(1)
    model = ViT(TINY, image_size=32, num_classes=5, classifier="gap")
    randomise_head(model)
    return model


@pytest.mark.parametrize("name", ["token_model", "gap_model"])
def test_attention_probabilities_and_tokens_are_the_models_own(name, request):
    model = request.getfixturevalue(name)
    size, channels = model.image_size[0], model.num_channels
    pixels = random_pixels(3, size, channels)
    tokens, probs = inspection.encoder_attention(model, pixels, batch_size=2)  # two batches
    rows, cols = model.grid_size
    t = rows * cols + inspection.num_prefix_tokens(model)
    assert probs.shape == (3, TINY.num_layers, TINY.num_heads, t, t)
    assert (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    # The tokens are what the model's encoder outputs inside the model...
    x = inspection.model_inputs(model, pixels)
    encoder_output = keras.Model(model.input, model.encoder.output)
    np.testing.assert_allclose(tokens, np.asarray(encoder_output(x)), atol=1e-5)
    # ...and the model's logits follow from them through its own head.
    logits = model.head(model.pooling(tokens))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(model(x)), atol=1e-4)
    # Every row is a softmax of q.k / sqrt(d) in the first block: recompute block 0 by hand.
    block = model.encoder.blocks[0]
    attention = block.attention
    h = np.asarray(block.attention_norm(inspection.embed(model, x)))
    q = np.einsum("btd,dhk->bthk", h, np.asarray(attention.query.kernel)) + np.asarray(attention.query.bias)
    k = np.einsum("btd,dhk->bthk", h, np.asarray(attention.key.kernel)) + np.asarray(attention.key.bias)
    logits0 = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(q.shape[-1])
    expected = np.exp(logits0 - logits0.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs[:, 0], expected, atol=1e-5)


def test_rollout_and_head_maps_cover_the_patch_grid(token_model, gap_model):
    for model in (token_model, gap_model):
        pixels = random_pixels(2, model.image_size[0], model.num_channels, seed=3)
        rows, cols = model.grid_size
        rollout = inspection.rollout_maps(model, pixels)
        heads = inspection.head_maps(model, pixels)
        assert rollout.shape == (2, rows, cols)
        assert heads.shape == (2, TINY.num_layers, TINY.num_heads, rows, cols)
        assert np.isfinite(rollout).all() and (rollout > 0).all()
    # GAP: the mean query row, which sums to 1 over the patches (there is nothing else).
    np.testing.assert_allclose(inspection.rollout_maps(gap_model, pixels).sum((1, 2)), 1.0, atol=1e-5)


def test_mean_attention_distance_over_batches_equals_the_direct_mean(token_model):
    pixels = random_pixels(5, 28, 1, seed=4)
    got = inspection.mean_attention_distance(token_model, pixels, batch_size=2)
    _, probs = inspection.encoder_attention(token_model, pixels)
    direct = inspection.attention_distance(probs, (7, 7), 4, prefix_tokens=1).mean(0)
    assert got.shape == (TINY.num_layers, TINY.num_heads)
    np.testing.assert_allclose(got, direct, rtol=1e-5)
    # Bounded by the farthest pair of patch centres (6 * sqrt(2) patches of 4 px).
    assert (got > 0).all() and (got < 4 * 6 * np.sqrt(2)).all()


def test_embedding_filter_pca_reads_the_projection_kernel(token_model):
    components, ratio = inspection.embedding_filter_pca(token_model, 28)
    kernel = np.asarray(token_model.patch_embedding.projection.kernel)  # (4, 4, 1, 32)
    # 32 filters of 16 values: at most 16 components, shaped as a filter.
    assert components.shape == (16, 4, 4, 1)
    assert np.all(np.diff(ratio) <= 1e-7) and ratio.sum() == pytest.approx(1.0, abs=1e-5)
    # Reference: eigenvectors of the filters' covariance, the filters laid out per output channel.
    filters = np.transpose(kernel, (3, 0, 1, 2)).reshape(32, -1)
    filters = filters - filters.mean(0)
    eigenvalues, eigenvectors = np.linalg.eigh(filters.T @ filters)
    first = eigenvectors[:, np.argmax(eigenvalues)].reshape(4, 4, 1)
    assert abs(float(np.sum(first * components[0]))) == pytest.approx(1.0, abs=1e-4)


def test_embedding_filter_pca_of_an_rgb_model_has_28_rgb_components(gap_model):
    components, _ = inspection.embedding_filter_pca(gap_model, 28)
    assert components.shape == (28, 4, 4, 3)  # 32 filters of 48 values


def test_position_similarity_skips_the_class_token(token_model):
    table = np.random.default_rng(5).normal(size=(1, 50, 32)).astype("float32")
    original = np.asarray(token_model.position_embedding.pos_embedding)
    token_model.position_embedding.pos_embedding.assign(table)
    try:
        sim = inspection.position_embedding_similarity(token_model)
    finally:
        token_model.position_embedding.pos_embedding.assign(original)
    patches = table[0, 1:] / np.linalg.norm(table[0, 1:], axis=-1, keepdims=True)
    assert sim.shape == (7, 7, 7, 7)
    np.testing.assert_allclose(sim.reshape(49, 49), patches @ patches.T, atol=1e-5)
    np.testing.assert_allclose(sim[2, 3, 2, 3], 1.0, atol=1e-6)


def test_model_inputs_respect_the_models_preprocessing():
    pixels = np.full((1, 16, 16, 3), 255, np.uint8)
    plain = ViT(TINY, image_size=8, num_classes=2, num_channels=1)
    scaled = ViT(TINY, image_size=8, num_classes=2, num_channels=1, include_preprocessing=True)
    x_plain, x_scaled = inspection.model_inputs(plain, pixels), inspection.model_inputs(scaled, pixels)
    assert x_plain.shape == x_scaled.shape == (1, 8, 8, 1)  # resized, RGB -> gray
    np.testing.assert_allclose(x_plain, 1.0, atol=1e-5)  # [-1, 1]
    np.testing.assert_allclose(x_scaled, 255.0, atol=1e-3)  # the model scales 0..255 itself
    # Same weights, each fed what it expects: the same attention.
    scaled.set_weights(plain.get_weights())
    pixels = random_pixels(2, 8, 1, seed=6)
    np.testing.assert_allclose(inspection.encoder_attention(plain, pixels)[1],
                               inspection.encoder_attention(scaled, pixels)[1], atol=1e-5)


def test_hybrid_model_has_attention_but_no_pixel_filters():
    model = ViT(TINY.replace(patch_size=1, resnet=ResNetConfig(num_layers=(1,))), image_size=32, num_classes=3)
    pixels = random_pixels(1, 32, 3)
    _, probs = inspection.encoder_attention(model, pixels)
    assert probs.shape == (1, 2, 2, 65, 65)  # 32 / 4 = 8x8 patches + class token
    assert inspection.mean_attention_distance(model, pixels).shape == (2, 2)
    with pytest.raises(ValueError, match="hybrid"):
        inspection.embedding_filter_pca(model)


def test_maps_skip_distillation_and_register_tokens():
    """DINOv2's registers and DeiT's distillation token are prefix tokens: maps
    cover the patch grid only; a class token's row is read, else (GAP with
    registers) the mean of the patch tokens' rows, which is what it pools."""
    from keras_vit.inspection.attention import reads_class_token

    keras.utils.set_random_seed(2)
    pixels = random_pixels(2, 16, 3, seed=4)
    for fields, prefix, reads_class in (({"num_register_tokens": 2}, 3, True),
                                        ({"num_register_tokens": 2, "classifier": "gap"}, 2, False),
                                        ({"distillation_token": True, "distillation_head": True}, 2, True)):
        model = ViT(TINY.replace(**fields), image_size=16, num_classes=3)
        assert (model.num_prefix_tokens, reads_class_token(model)) == (prefix, reads_class)
        _, probabilities = inspection.encoder_attention(model, pixels)
        rollout = inspection.attention_rollout(probabilities)  # (B, T, T), T = prefix + 16
        row = rollout[:, 0] if reads_class else rollout[:, prefix:].mean(axis=1)
        np.testing.assert_allclose(inspection.rollout_maps(model, pixels), row[:, prefix:].reshape(2, 4, 4),
                                   rtol=1e-5)
        assert inspection.head_maps(model, pixels).shape == (2, TINY.num_layers, TINY.num_heads, 4, 4)
