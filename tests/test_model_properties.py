"""#23 item 6: what a model is (its prefix tokens, whether it returns
probabilities, whether it takes raw pixels) has one home, the model, and
every reader (export, predict, inspection, weights) asks it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import images
from keras_vit.export import serving
from keras_vit.inspection import attention
from keras_vit.model import activation_name, output_activation
from tests.conftest import tiny_config


@pytest.mark.parametrize("classifier, prefix", [("token", 1), ("gap", 0)])
def test_num_prefix_tokens(classifier, prefix):
    model = keras_vit.ViT(tiny_config(classifier=classifier), image_size=8, num_classes=2)
    assert model.num_prefix_tokens == prefix == attention.num_prefix_tokens(model)
    tokens = model.embed(np.zeros((1, 8, 8, 3), np.float32))
    assert tokens.shape[1] == prefix + model.grid_size[0] * model.grid_size[1]
    assert model.encoder.num_prefix_tokens == prefix


@pytest.mark.parametrize("activation, expected", [
    (None, None), ("linear", None), ("softmax", "softmax"), ("sigmoid", "sigmoid"),
    (keras.activations.sigmoid, "sigmoid"), (tf.nn.softmax, "softmax"), ("relu", None)])
def test_output_activation_however_given(activation, expected, tmp_path):
    model = keras_vit.ViT(tiny_config(), image_size=8, num_classes=3, classifier_activation=activation)
    assert model.output_activation == expected and model.returns_probabilities == (expected is not None)
    if activation in (None, "softmax", "sigmoid"):  # and as loaded from a .keras file
        model.save(tmp_path / "m.keras")
        assert keras.saving.load_model(tmp_path / "m.keras").output_activation == expected


def test_readers_ask_the_model():
    features = keras_vit.ViT(tiny_config(), image_size=8, include_top=False)
    assert features.output_activation is None and not features.returns_probabilities
    raw = keras_vit.ViT(tiny_config(), image_size=8, num_classes=2, include_preprocessing=True,
                        classifier_activation="sigmoid")
    assert images.takes_raw_pixels(raw) and serving.takes_raw_pixels(raw) and raw.takes_raw_pixels
    assert keras_vit.model.returns_probabilities(raw)


def test_any_keras_model_is_read_from_its_last_layer():
    inputs = keras.Input((4,))
    dense = keras.Model(inputs, keras.layers.Dense(3, activation="sigmoid")(inputs))
    layer = keras.Model(inputs, keras.layers.Softmax()(keras.layers.Dense(3)(inputs)))
    logits = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    assert [output_activation(m) for m in (dense, layer, logits)] == ["sigmoid", "softmax", None]
    assert activation_name({"module": "keras.activations", "class_name": "function", "config": "sigmoid",
                            "registered_name": "sigmoid"}) == "sigmoid"


def test_the_backbone_is_built_once_shares_the_weights_and_is_not_saved(tmp_path):
    """#38 item 6: `backbone` was a new keras.Model at every access."""
    model = keras_vit.ViT(tiny_config(), image_size=8, num_classes=2)
    backbone = model.backbone
    assert model.backbone is backbone and backbone.get_layer("Transformer") is model.encoder
    images = np.random.default_rng(0).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(backbone(images), model.forward_stages(images, attention=False)["tokens"], atol=1e-6)
    model.save(tmp_path / "m.keras")
    assert len(keras_vit.load_model(tmp_path / "m.keras").weights) == len(model.weights)
