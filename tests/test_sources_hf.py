"""HF transformers ViT directories in and out, against transformers itself:
random (perturbed) transformers models written by their own save_pretrained
load with their logits; ours written by save_pretrained load in transformers
with ours."""

import json
import os

import numpy as np
import pytest
import transformers

import keras_vit
from tests.conftest import tiny_config
from tests.sources_helpers import perturb_keras, perturb_torch, photos, torch_logits

SIZE = 32


def hf_config(**overrides):
    # transformers' defaults (exact GELU, eps 1e-12) at a tiny size.
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                image_size=SIZE, patch_size=8)
    base.update(overrides)
    return transformers.ViTConfig(**base)


@pytest.mark.slow
def test_classifier_directory_loads_with_transformers_logits(tmp_path):
    config = hf_config(num_labels=3, id2label={0: "cat", 1: "dog", 2: "tea"}, label2id={"cat": 0, "dog": 1, "tea": 2})
    assert config.hidden_act == "gelu" and config.layer_norm_eps == 1e-12
    hf = transformers.ViTForImageClassification(config).eval()
    perturb_torch(hf, 1)
    hf.save_pretrained(tmp_path / "hf")
    model = keras_vit.from_pretrained(str(tmp_path / "hf"))
    assert model.config.gelu_approximate is False and model.config.layer_norm_epsilon == 1e-12
    assert model.num_classes == 3 and model.labels == ["cat", "dog", "tea"] and model.image_size == (SIZE, SIZE)
    images = photos(SIZE)
    expected = torch_logits(hf, images)
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(np.asarray(model(images)), expected, atol=1e-4, rtol=0)


def test_each_numerics_field_matters(tmp_path):
    # The same weights with the official GELU, or the official eps, miss HF's logits by far more than the
    # right numerics do. Tiny embeddings make the first LayerNorm's variance small enough for eps to count.
    import torch

    hf = transformers.ViTForImageClassification(hf_config(num_labels=3)).eval()
    perturb_torch(hf, 1, scale=0.5)
    with torch.no_grad():
        for param in hf.vit.embeddings.parameters():
            param.mul_(1e-3)
    hf.save_pretrained(tmp_path / "hf")
    images = photos(SIZE)
    expected = torch_logits(hf, images)

    def error(**overrides):
        model = keras_vit.from_pretrained(str(tmp_path / "hf"), **overrides)
        return np.abs(np.asarray(model(images)) - expected).max()

    right = error()
    assert right < 1e-4
    assert error(gelu_approximate=True) > 20 * right
    assert error(layer_norm_epsilon=1e-6) > 20 * right


@pytest.mark.parametrize("pooler", [True, False])
def test_backbone_directory_with_and_without_pooler(tmp_path, pooler):
    hf = transformers.ViTModel(hf_config(), add_pooling_layer=pooler).eval()
    perturb_torch(hf, 2)
    hf.save_pretrained(tmp_path / "hf")
    model = keras_vit.from_pretrained(str(tmp_path / "hf"))
    assert not model.include_top
    assert model.config.representation_size == (32 if pooler else None)
    images = photos(SIZE)
    expected = torch_logits(hf, images, "pooler_output" if pooler else (lambda o: o.last_hidden_state[:, 0]))
    np.testing.assert_allclose(np.asarray(model(images)), expected, atol=1e-4, rtol=0)


def test_new_head_resize_and_constructor_weights(tmp_path):
    hf = transformers.ViTForImageClassification(hf_config(num_labels=3)).eval()
    perturb_torch(hf, 3)
    hf.save_pretrained(tmp_path / "hf")
    model = keras_vit.from_pretrained(str(tmp_path / "hf"), num_classes=5, image_size=48)
    assert model.num_classes == 5 and model.image_size == (48, 48)
    assert not np.asarray(model.head.kernel).any()  # a new zero head
    assert model.position_embedding.pos_embedding.shape == (1, 1 + 36, 32)
    # weights= of a constructor takes the same directory when the numerics are given ...
    config = tiny_config(patch_size=8, layer_norm_epsilon=1e-12, gelu_approximate=False)
    same = keras_vit.ViT(config, image_size=SIZE, num_classes=3, weights=str(tmp_path / "hf"))
    images = photos(SIZE)
    np.testing.assert_allclose(np.asarray(same(images)), torch_logits(hf, images), atol=1e-4, rtol=0)
    # ... and says which when they are not.
    with pytest.raises(ValueError, match=r"exact GELU and LayerNorm eps 1e-12.*gelu_approximate=False, "
                                         r"layer_norm_epsilon=1e-12.*from_pretrained"):
        keras_vit.ViT(tiny_config(patch_size=8), image_size=SIZE, num_classes=3, weights=str(tmp_path / "hf"))


@pytest.mark.parametrize("include_top", [True, False])
def test_save_pretrained_round_trips_through_transformers(tmp_path, include_top):
    config = tiny_config(patch_size=8, layer_norm_epsilon=1e-12, gelu_approximate=False,
                         representation_size=None if include_top else 24)
    model = keras_vit.ViT(config, image_size=SIZE, num_classes=4, include_top=include_top)
    perturb_keras(model, 4)
    out = keras_vit.save_pretrained(model, tmp_path / "out", labels=["a", "b", "c", "d"] if include_top else None)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["hidden_act"] == "gelu" and written["layer_norm_eps"] == 1e-12
    images = photos(SIZE)
    if include_top:
        assert written["id2label"] == {"0": "a", "1": "b", "2": "c", "3": "d"}
        hf = transformers.ViTForImageClassification.from_pretrained(out).eval()
        expected = torch_logits(hf, images)
    else:
        hf = transformers.ViTModel.from_pretrained(out).eval()
        expected = torch_logits(hf, images, "pooler_output")
    np.testing.assert_allclose(expected, np.asarray(model(images)), atol=1e-4, rtol=0)
    # And back: the same model again.
    again = keras_vit.from_pretrained(out)
    np.testing.assert_allclose(np.asarray(again(images)), np.asarray(model(images)), atol=1e-5, rtol=0)


def test_official_numerics_are_written_as_tanh_gelu(tmp_path):
    model = keras_vit.ViT(tiny_config(patch_size=8), image_size=SIZE, num_classes=2)
    perturb_keras(model, 5)
    keras_vit.save_pretrained(model, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["hidden_act"] == "gelu_pytorch_tanh" and written["layer_norm_eps"] == 1e-6
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "out").eval()
    images = photos(SIZE)
    np.testing.assert_allclose(torch_logits(hf, images), np.asarray(model(images)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("config,match", [
    (tiny_config(patch_size=8, classifier="gap"), "classifier='gap'"),
    (tiny_config(patch_size=8, representation_size=16), "representation layer before its head"),
])
def test_layouts_hf_cannot_express_are_refused_before_writing(tmp_path, config, match):
    model = keras_vit.ViT(config, image_size=SIZE, num_classes=2)
    with pytest.raises(ValueError, match=match):
        keras_vit.save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"not unpickled")
    for source in (tmp_path / "hf", tmp_path / "hf" / "pytorch_model.bin"):
        with pytest.raises(ValueError, match="never unpickles.*Convert it to safetensors"):
            keras_vit.from_pretrained(str(source))


def test_other_hf_models_and_qkv_without_bias_are_refused_by_name(tmp_path):
    hf = transformers.ViTForImageClassification(hf_config(num_labels=2))
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    original = json.loads(path.read_text())
    for change, match in (({"model_type": "deit"}, "distillation token"),
                          ({"qkv_bias": False}, "qkv_bias=False"),
                          ({"hidden_act": "relu"}, "hidden_act='relu'")):
        path.write_text(json.dumps({**original, **change}))
        with pytest.raises(ValueError, match=match):
            keras_vit.from_pretrained(str(tmp_path / "hf"))


def test_unknown_tensors_are_reported_and_nothing_is_assigned(tmp_path):
    from safetensors.numpy import load_file, save_file

    hf = transformers.ViTForImageClassification(hf_config(num_labels=2))
    hf.save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["vit.embeddings.mask_token"] = np.zeros((1, 1, 32), np.float32)
    del tensors["vit.encoder.layer.1.output.dense.bias"]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    model = keras_vit.ViT(tiny_config(patch_size=8, layer_norm_epsilon=1e-12, gelu_approximate=False),
                          image_size=SIZE, num_classes=2)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError) as error:
        keras_vit.load_weights(model, str(tmp_path / "hf"))
    assert "not in the model (1): vit.embeddings.mask_token" in str(error.value)
    assert "missing from the checkpoint" in str(error.value)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_save_pretrained_replaces_the_directory_whole_and_keeps_it_on_failure(tmp_path, monkeypatch):
    from keras_vit import errors
    from keras_vit.weights import hf as hf_weights

    first = keras_vit.ViT(tiny_config(patch_size=8), image_size=SIZE, num_classes=2)
    keras_vit.save_pretrained(first, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    second = keras_vit.ViT(tiny_config(patch_size=8), image_size=SIZE, num_classes=3)

    def full_disk(tensors, path):
        open(path, "wb").write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf_weights, "write_safetensors", full_disk)
    with pytest.raises(OSError, match="No space"):
        keras_vit.save_pretrained(second, tmp_path / "out")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert os.listdir(tmp_path) == ["out"]  # no staging folder left
    monkeypatch.undo()
    keras_vit.save_pretrained(second, tmp_path / "out")  # a second save replaces the first
    assert json.loads((tmp_path / "out" / "config.json").read_text())["id2label"].keys() == {"0", "1", "2"}
    (tmp_path / "out" / "README.md").write_text("mine")
    with pytest.raises(errors.UserError, match="also holds README.md"):
        keras_vit.save_pretrained(second, tmp_path / "out")
    assert (tmp_path / "out" / "README.md").read_text() == "mine"


@pytest.mark.slow
def test_a_transformers_folder_as_train_weights_fine_tunes_its_encoder(tmp_path, capsys):
    """#30: `keras-vit train --weights HF_FOLDER` (as predict/export take it): the folder's
    architecture and numerics, its encoder exactly, a new zero head."""
    from PIL import Image

    from keras_vit.cli import main

    hf = transformers.ViTForImageClassification(hf_config(num_labels=5)).eval()
    perturb_torch(hf, 3)
    hf.save_pretrained(tmp_path / "hf")
    images = photos(SIZE)
    for i, image in enumerate(images):  # a class per photo, ten copies each (every 10th is held out)
        folder = tmp_path / "photos" / "ab"[i]
        folder.mkdir(parents=True)
        for copy in range(10):
            Image.fromarray(np.clip(image * 127.5 + 127.5, 0, 255).astype("uint8")).save(folder / f"{copy}.png")
    workdir = tmp_path / "run"
    assert main(["train", "--weights", str(tmp_path / "hf"), "--dataset", f"folder:{tmp_path / 'photos'}",
                 "--recipe", "finetune", "--steps", "0", "--warmup-steps", "0", "--batch-size", "4", "--image-size", str(SIZE),
                 "--workdir", str(workdir), "--no-progress", "--strategy", "default", "--no-jit"]) == 0, \
        capsys.readouterr().err
    tuned = keras_vit.load_model(str(workdir))
    source = keras_vit.from_pretrained(str(tmp_path / "hf"), include_top=False)
    assert tuned.config.gelu_approximate is False and tuned.config.layer_norm_epsilon == 1e-12
    assert tuned.num_classes == 2 and not np.any(tuned.get_layer("head").kernel.numpy())
    features = keras_vit.ViT(tuned.config, image_size=SIZE, include_top=False)
    features.set_weights([w for w, v in zip(tuned.get_weights(), tuned.weights) if not v.path.startswith("head")])
    np.testing.assert_allclose(np.asarray(features(images)), np.asarray(source(images)), atol=1e-5, rtol=0)
