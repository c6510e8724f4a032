"""peft LoRA adapter folders (#39) against peft itself: random, perturbed transformers bases
(every weight, the updates and the saved classifier too), adapters written by peft's own
save_pretrained, read by keras_vit.from_pretrained with peft's outputs; the adapters of
transformers 4.x's module names (query/value) as well as 5.x's (q_proj/v_proj); refusals."""

import json
import re

import numpy as np
import peft
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import keras_vit
from keras_vit.errors import UserError
from keras_vit.runs.source import is_checkpoint
from tests.sources_helpers import perturb_torch
from tests.test_hf_families import pixels

SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80, image_size=32,
             patch_size=8)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")


def _adapter(tmp_path, name, base_model, lora_config):
    """(the peft model, its adapter folder): the base written and read back by transformers (so
    peft records its folder as base_model_name_or_path), every update and saved module perturbed."""
    perturb_torch(base_model, seed=1)
    base_model.save_pretrained(tmp_path / f"{name}-base")
    base = type(base_model).from_pretrained(tmp_path / f"{name}-base")
    adapted = peft.get_peft_model(base, lora_config)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for key, parameter in adapted.named_parameters():
            if parameter.requires_grad:  # the updates (B starts at zero) and the modules to save
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    adapted.eval()
    adapted.save_pretrained(tmp_path / name)
    return adapted, tmp_path / name


@pytest.fixture(scope="module")
def vit_adapter(tmp_path_factory):
    """ViT-for-classification's query and value (5.x names) and MLP, rank 4, alpha 8, the classifier saved."""
    config = transformers.ViTConfig(**SMALL, num_labels=5)
    return _adapter(tmp_path_factory.mktemp("peft"), "vit", transformers.ViTForImageClassification(config),
                    peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1", "fc2"],
                                    modules_to_save=["classifier"]))


def _logits(adapted):
    with torch.no_grad():
        return adapted(pixel_values=pixels(IMAGES)).logits.numpy()


def test_a_vit_adapter_gives_peft_s_logits(vit_adapter):
    adapted, folder = vit_adapter
    model = keras_vit.from_pretrained(str(folder))
    assert model.config.lora_rank == 0  # merged: the base's architecture
    expected = _logits(adapted)
    np.testing.assert_allclose(model(IMAGES), expected, atol=1e-4, rtol=1e-4)
    assert np.abs(expected - _logits(adapted.get_base_model().__class__.from_pretrained(
        json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]))).max() > 1e-2
    assert is_checkpoint(str(folder))  # predict, export and --weights take the folder as any checkpoint


def test_the_same_adapter_in_transformers_4_names_gives_the_same_logits(vit_adapter, tmp_path):
    """transformers 4.x's module paths, as adapters trained before 5 hold them
    (vit.encoder.layer.0.attention.attention.query, intermediate.dense, output.dense)."""
    adapted, folder = vit_adapter
    old = {"q_proj": "attention.attention.query", "v_proj": "attention.attention.value",
           "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}

    def renamed(key):
        key = re.sub(r"vit\.layers\.(\d+)\.", r"vit.encoder.layer.\1.", key)
        for new, was in old.items():
            key = key.replace(f".attention.{new}.", f".{was}.") if new.endswith("proj") else key.replace(
                f".{new}.", f".{was}.")
        return key

    tensors = {renamed(k): v for k, v in load_file(folder / "adapter_model.safetensors").items()}
    assert any(".attention.attention.query.lora_A" in k for k in tensors)
    (tmp_path / "old").mkdir()
    save_file(tensors, tmp_path / "old" / "adapter_model.safetensors")
    settings = json.loads((folder / "adapter_config.json").read_text())
    settings["target_modules"] = ["query", "value", "dense"]
    (tmp_path / "old" / "adapter_config.json").write_text(json.dumps(settings))
    np.testing.assert_allclose(keras_vit.from_pretrained(str(tmp_path / "old"))(IMAGES), _logits(adapted),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["dinov2", "clip"])
def test_a_family_tower_adapter_with_per_module_ranks_and_rslora_gives_peft_s_embedding(family, tmp_path):
    if family == "dinov2":
        base = transformers.Dinov2Model(transformers.Dinov2Config(**SMALL))
    else:
        base = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**SMALL))
    out = "o_proj" if family == "dinov2" else "out_proj"
    adapted, folder = _adapter(tmp_path, family, base, peft.LoraConfig(
        r=4, lora_alpha=6, target_modules=["q_proj", "k_proj", out, "fc1", "fc2"], use_rslora=True,
        rank_pattern={"fc1": 2}, alpha_pattern={out: 3}))
    with torch.no_grad():
        expected = adapted(pixel_values=pixels(IMAGES)).pooler_output.numpy()
    model = keras_vit.from_pretrained(str(folder), include_top=False)
    np.testing.assert_allclose(model(IMAGES), expected, atol=1e-4, rtol=1e-4)


def _edited(folder, tmp_path, **changes):
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "adapter_model.safetensors").write_bytes((folder / "adapter_model.safetensors").read_bytes())
    settings = {**json.loads((folder / "adapter_config.json").read_text()), **changes}
    (edited / "adapter_config.json").write_text(json.dumps(settings))
    return edited


@pytest.mark.parametrize("changes, message", [
    (dict(base_model_name_or_path="/nowhere/vit-base"), "its base model '/nowhere/vit-base' does not exist"),
    (dict(base_model_name_or_path=None), "adapter_config.json names no base model"),
    (dict(use_dora=True), "is a DoRA adapter"),
    (dict(peft_type="IA3"), "is a peft IA3 adapter; keras-vit reads LoRA adapters"),
])
def test_an_adapter_that_cannot_be_read_is_one_line(vit_adapter, tmp_path, changes, message):
    with pytest.raises(UserError, match=re.escape(message)) as error:
        keras_vit.from_pretrained(str(_edited(vit_adapter[1], tmp_path, **changes)))
    assert "\n" not in str(error.value)


def test_an_adapter_on_another_base_is_one_line(vit_adapter, tmp_path):
    other = transformers.ViTForImageClassification(transformers.ViTConfig(**{**SMALL, "hidden_size": 24}, num_labels=5))
    other.save_pretrained(tmp_path / "other")
    edited = _edited(vit_adapter[1], tmp_path, base_model_name_or_path=str(tmp_path / "other"))
    with pytest.raises(UserError, match="the adapter was trained on another architecture; give it the base"):
        keras_vit.from_pretrained(str(edited))


@pytest.mark.slow
def test_a_lora_run_from_a_vit_folder_writes_an_adapter_peft_loads(vit_adapter, tmp_path):
    """A LoRA run from an HF ViT folder writes WORKDIR/peft; peft applies it to that base
    (a ViTForImageClassification with the run's classes) and gives the run's model.keras logits."""
    from keras_vit.training import TrainConfig, train

    base = json.loads((vit_adapter[1] / "adapter_config.json").read_text())["base_model_name_or_path"]
    config = TrainConfig.create("finetune", weights=base, dataset="mnist5k", image_size=32, steps=2, batch_size=8,
                                warmup_steps=0, learning_rate=0.05, eval_batch_size=100, workdir=str(tmp_path / "run"),
                                lora_rank=2, lora_alpha=3, lora_targets=("query", "out", "mlp"), progress=False,
                                jit_compile=False, strategy="default")
    results = train(config)
    folder = results["peft_adapter_path"]
    settings = json.loads((tmp_path / "run" / "peft" / "adapter_config.json").read_text())
    assert settings["target_modules"] == ["fc1", "fc2", "o_proj", "q_proj"] and settings["base_model_name_or_path"] == base
    hf = transformers.ViTForImageClassification.from_pretrained(base, num_labels=10, ignore_mismatched_sizes=True)
    adapted = peft.PeftModel.from_pretrained(hf, folder).eval()
    model = keras_vit.load_model(str(tmp_path / "run"))
    digits = np.random.default_rng(3).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    with torch.no_grad():
        expected = adapted(pixel_values=pixels(digits)).logits.numpy()
    np.testing.assert_allclose(model(digits), expected, atol=1e-4, rtol=1e-4)
    assert np.abs(model(digits)).max() > 1e-3  # the head moved: the comparison means something
