"""The assembled model: inputs and outputs, Keras conventions, bad input."""

import numpy as np
import pytest
import keras
import tensorflow as tf

import keras_vit
from tests.conftest import tiny_config, tiny_hybrid_config


def test_logits_by_default_and_head_starts_at_zero(rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=5)
    out = model(rng.uniform(-1, 1, size=(3, 16, 16, 3)).astype("float32"))
    assert out.shape == (3, 5)
    np.testing.assert_array_equal(np.asarray(out), 0)  # zero head
    assert model.head.dtype == "float32"


def test_include_top_false_returns_the_heads_input(rng):
    images = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    features = keras_vit.ViT(tiny_config(representation_size=12), image_size=16, include_top=False)
    assert features(images).shape == (2, 12)  # after the representation layer
    assert features.head is None
    plain = keras_vit.ViT(tiny_config(), image_size=16, include_top=False)
    assert plain(images).shape == (2, 32)


def test_representation_layer_is_dense_tanh(rng):
    model = keras_vit.ViT(tiny_config(representation_size=12), image_size=16, include_top=False)
    values = np.asarray(model(rng.uniform(-1, 1, size=(4, 16, 16, 3)).astype("float32")))
    assert np.all(np.abs(values) < 1)
    assert model.pre_logits.activation is keras.activations.tanh


def test_include_preprocessing_takes_0_255(rng):
    pixels = rng.integers(0, 256, size=(2, 16, 16, 3)).astype("float32")
    plain = keras_vit.ViT(tiny_config(), image_size=16, include_top=False)
    wrapped = keras_vit.ViT(tiny_config(), image_size=16, include_top=False, include_preprocessing=True)
    wrapped.set_weights(plain.get_weights())
    np.testing.assert_allclose(np.asarray(wrapped(pixels)),
                               np.asarray(plain(keras_vit.preprocess_input(pixels))), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(keras_vit.preprocess_input(np.array([0.0, 127.5, 255.0]))),
                               [-1, 0, 1])


def test_classifier_activation(rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=4, classifier_activation="softmax")
    model.head.kernel.assign(rng.normal(size=(32, 4)).astype("float32"))
    probs = np.asarray(model(rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")))
    np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-5)


def test_gap_classifier_has_no_class_token(rng):
    model = keras_vit.ViT(tiny_config(classifier="gap"), image_size=16, num_classes=3)
    assert model.class_token is None
    assert tuple(model.position_embedding.pos_embedding.shape) == (1, 16, 32)


def test_non_square_images_and_any_batch_size(rng):
    model = keras_vit.ViT(tiny_config(), image_size=(8, 16), num_classes=3)
    assert model.grid_size == (2, 4)
    for batch in (1, 5):
        assert model(np.zeros((batch, 8, 16, 3), "float32")).shape == (batch, 3)
    assert model.predict(np.zeros((7, 8, 16, 3), "float32"), batch_size=3, verbose=0).shape == (7, 3)


def test_hybrid_builds_and_runs(rng):
    model = keras_vit.ViT(tiny_hybrid_config(), image_size=32, num_classes=3)
    assert model.grid_size == (4, 4)
    assert model(rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")).shape == (2, 3)


def test_summary_names_the_layers():
    model = keras_vit.ViT(tiny_config(representation_size=8), image_size=16, num_classes=3)
    lines = []
    model.summary(print_fn=lambda line, **kw: lines.append(line))
    text = "\n".join(lines)
    for name in ("embedding", "cls", "posembed_input", "Transformer", "pooling", "pre_logits", "head"):
        assert name in text


def test_keras_file_round_trip(tmp_path, rng):
    model = keras_vit.ViT(tiny_hybrid_config(representation_size=8, dropout_rate=0.1), image_size=32,
                          num_classes=3, classifier_activation="softmax", include_preprocessing=True)
    model.head.kernel.assign(rng.normal(size=(8, 3)).astype("float32"))
    images = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored, keras_vit.ViT)
    assert restored.config == model.config and restored.include_preprocessing
    np.testing.assert_allclose(np.asarray(restored(images)), np.asarray(model(images)), rtol=1e-5, atol=1e-6)


def test_get_config_round_trip():
    model = keras_vit.ViT(tiny_config(classifier="gap"), image_size=(8, 12), num_classes=2, name="mine")
    clone = keras_vit.ViT.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    assert clone.count_params() == model.count_params()


@pytest.mark.slow
def test_jit_compile_matches_eager(rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    model.head.kernel.assign(rng.normal(size=(32, 3)).astype("float32"))
    images = rng.uniform(-1, 1, size=(4, 16, 16, 3)).astype("float32")
    compiled = tf.function(lambda x: model(x), jit_compile=True)
    np.testing.assert_allclose(np.asarray(compiled(images)), np.asarray(model(images)), rtol=1e-4, atol=1e-5)
    model.compile(loss="mse", jit_compile=True)
    assert model.predict(images, verbose=0).shape == (4, 3)


def test_mixed_bfloat16(rng):
    images = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    reference = keras_vit.ViT(tiny_config(), image_size=16, include_top=False)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
        features = keras_vit.ViT(tiny_config(), image_size=16, include_top=False)
    finally:
        keras.config.set_dtype_policy("float32")
    features.set_weights(reference.get_weights())
    assert model(images).dtype == "float32"  # the head computes in float32
    assert all(w.dtype == "float32" for w in model.weights)
    low = np.asarray(features(images), "float32")
    np.testing.assert_allclose(low, np.asarray(reference(images)), atol=0.1)


def test_builds_under_a_distribution_strategy():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    assert all(isinstance(v.value, tf.Variable) for v in model.weights)
    assert model(np.zeros((1, 16, 16, 3), "float32")).shape == (1, 3)


def test_dropout_and_stochastic_depth_only_in_training(rng):
    model = keras_vit.ViT(tiny_config(dropout_rate=0.3, stochastic_depth_rate=0.3), image_size=16,
                          include_top=False)
    images = rng.uniform(-1, 1, size=(4, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(model(images)), np.asarray(model(images)))
    assert not np.allclose(np.asarray(model(images, training=True)), np.asarray(model(images)))


# --- Bad input ---------------------------------------------------------------------

def test_image_size_not_divisible_by_patch():
    with pytest.raises(ValueError, match=r"image_size \(30, 30\) is not divisible by the patch size 4"):
        keras_vit.ViT(tiny_config(), image_size=30)


def test_hybrid_image_size_not_divisible_by_total_stride():
    with pytest.raises(ValueError, match="not divisible by the patch size 8 .patch size x ResNet stride"):
        keras_vit.ViT(tiny_hybrid_config(), image_size=36)


def test_wrong_channel_count(rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    with pytest.raises(ValueError, match="expects images with 3 channels.*num_channels=1"):
        model(np.zeros((1, 16, 16, 1), "float32"))
    with pytest.raises(ValueError, match="expects images with 3 channels"):
        model.predict(np.zeros((2, 16, 16, 4), "float32"), verbose=0)


def test_wrong_rank():
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    with pytest.raises(ValueError, match="4 dimensions"):
        model(np.zeros((16, 16, 3), "float32"))


def test_single_channel_model(rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3, num_channels=1)
    assert model(np.zeros((2, 16, 16, 1), "float32")).shape == (2, 3)


def test_unknown_config_field():
    with pytest.raises(ValueError, match="Unknown ViTConfig field.*'representaton_size'"):
        keras_vit.ViT(tiny_config(), image_size=16, representaton_size=8)


def test_bad_config_values():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        tiny_config(num_heads=5)
    with pytest.raises(ValueError, match="classifier must be one of"):
        tiny_config(classifier="cls")
    with pytest.raises(ValueError, match="dropout_rate must be in"):
        tiny_config(dropout_rate=1.5)


def test_weights_name_without_checkpoint_for_variant():
    with pytest.raises(ValueError, match="No 'imagenet21k' checkpoint is published for ViT Ti/16.*augreg-imagenet21k"):
        keras_vit.ViT_Ti16(weights="imagenet21k")


def test_unknown_weights():
    with pytest.raises(ValueError, match="neither an existing file nor a known checkpoint name"):
        keras_vit.ViT(tiny_config(), image_size=16, weights="imagenet42")


def test_embed_then_encoder_is_the_model(rng):
    model = keras_vit.ViT(tiny_hybrid_config(), image_size=32, include_top=False, include_preprocessing=True)
    pixels = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    tokens = model.embed(pixels)
    assert tokens.shape == (2, 17, 32)
    np.testing.assert_allclose(np.asarray(model.pooling(model.encoder(tokens))), np.asarray(model(pixels)),
                               rtol=1e-5, atol=1e-5)
