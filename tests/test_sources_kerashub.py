"""keras-hub ViT presets, against keras-hub itself: a perturbed ViTBackbone (and
ViTImageClassifier) written by its own save_to_preset loads with its outputs."""

import numpy as np
import pytest

import keras_vit
from tests.sources_helpers import perturb_keras, photos

keras_hub = pytest.importorskip("keras_hub")  # the `reference` extra installs it

SIZE = 32


def backbone(**overrides):
    args = dict(image_shape=(SIZE, SIZE, 3), patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                layer_norm_epsilon=1e-5)
    args.update(overrides)
    return keras_hub.models.ViTBackbone(**args)


@pytest.mark.slow
def test_backbone_preset_loads_with_keras_hub_outputs(tmp_path):
    hub = backbone()
    perturb_keras(hub, 1, scale=0.5)
    hub.save_to_preset(str(tmp_path / "preset"))
    model = keras_vit.from_pretrained(str(tmp_path / "preset"))
    assert not model.include_top and model.config.gelu_approximate is False
    assert model.config.layer_norm_epsilon == 1e-5
    images = photos(SIZE)
    expected = np.asarray(hub(images))[:, 0]  # the class token after the final LayerNorm
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(np.asarray(model(images)), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("intermediate_dim", [None, pytest.param(16, marks=pytest.mark.slow)])  # the second: make test (#36)
def test_classifier_preset_through_keras_hubs_loader(tmp_path, intermediate_dim):
    task = keras_hub.models.ViTImageClassifier(backbone=backbone(), num_classes=3, preprocessor=None,
                                               intermediate_dim=intermediate_dim)
    perturb_keras(task, 2, scale=0.5)
    task.save_to_preset(str(tmp_path / "preset"))
    # "kerashub:" goes through keras-hub's own from_preset, which also takes a local directory.
    model = keras_vit.from_pretrained("kerashub:" + str(tmp_path / "preset"))
    assert model.num_classes == 3 and model.config.representation_size == intermediate_dim
    images = photos(SIZE)
    np.testing.assert_allclose(np.asarray(model(images)), np.asarray(task(images)), atol=1e-4, rtol=0)


def test_layout_without_biases_is_refused_by_name(tmp_path):
    backbone(use_mha_bias=False).save_to_preset(str(tmp_path / "preset"))
    with pytest.raises(ValueError, match="use_mha_bias=False.*cannot be expressed"):
        keras_vit.from_pretrained(str(tmp_path / "preset"))
