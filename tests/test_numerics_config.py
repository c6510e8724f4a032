"""ViTConfig.layer_norm_epsilon / gelu_approximate: the official defaults stay,
other values reach every layer and survive .keras files; files written before
these fields existed load with the official values."""

import json
import zipfile

import keras
import numpy as np

import keras_vit
from tests.conftest import tiny_config


def _norms(model):
    yield model.encoder.encoder_norm
    for block in model.encoder.blocks:
        yield block.attention_norm
        yield block.mlp_norm


def test_official_defaults():
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=2)
    assert model.config.layer_norm_epsilon == 1e-6 and model.config.gelu_approximate is True
    assert all(norm.epsilon == 1e-6 for norm in _norms(model))
    assert all(block.mlp.gelu_approximate for block in model.encoder.blocks)


def test_hf_numerics_reach_every_layer_and_round_trip_through_keras_files(tmp_path, rng):
    config = tiny_config(layer_norm_epsilon=1e-12, gelu_approximate=False)
    model = keras_vit.ViT(config, image_size=16, num_classes=3)
    assert all(norm.epsilon == 1e-12 for norm in _norms(model))
    assert not any(block.mlp.gelu_approximate for block in model.encoder.blocks)
    model.head.kernel.assign(rng.normal(size=(32, 3)).astype("float32"))
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert restored.config == config
    images = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(restored(images)), np.asarray(model(images)), atol=1e-6)


def test_keras_file_without_the_new_fields_loads_with_official_numerics(tmp_path, rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    path = tmp_path / "m.keras"
    model.save(path)
    # Rewrite the file as a version without the two fields would have written it.
    old = tmp_path / "old.keras"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "config.json":
                text = json.loads(data)
                for key in ("layer_norm_epsilon", "gelu_approximate"):
                    del text["config"]["config"][key]
                data = json.dumps(text).encode()
                assert b"gelu_approximate" not in data
            dst.writestr(item, data)
    restored = keras.models.load_model(old)
    assert restored.config.layer_norm_epsilon == 1e-6 and restored.config.gelu_approximate is True
    images = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(restored(images)), np.asarray(model(images)), atol=1e-6)


def test_bad_epsilon_is_refused():
    import pytest

    with pytest.raises(ValueError, match="layer_norm_epsilon"):
        tiny_config(layer_norm_epsilon=0.0)
