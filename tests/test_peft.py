"""peft LoRA adapter folders (#39) against peft itself: random, perturbed transformers bases
(every weight, the updates and the saved classifier too), adapters written by peft's own
save_pretrained, read by keras_vit.from_pretrained with peft's outputs; the adapters of
transformers 4.x's module names (query/value) as well as 5.x's (q_proj/v_proj); refusals."""

import json
import re
import shutil

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


def test_an_adapter_that_trains_norms_and_biases_loads_under_the_files_names(tmp_path):
    """transformers 5 module paths beyond the projections: a block's LayerNorms saved whole
    (modules_to_save) and every bias trained (bias="all") sit under "vit.layers.N." in the adapter
    and "vit.encoder.layer.N." in the base's files."""
    config = transformers.ViTConfig(**SMALL, num_labels=5)
    adapted, folder = _adapter(tmp_path, "vit", transformers.ViTForImageClassification(config), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], bias="all", modules_to_save=["classifier", "layernorm_before"]))
    saved = load_file(folder / "adapter_model.safetensors")
    assert any(".layers.1.layernorm_before." in k for k in saved) and any(".mlp.fc2.bias" in k for k in saved)
    np.testing.assert_allclose(keras_vit.from_pretrained(str(folder))(IMAGES), _logits(adapted), atol=1e-4, rtol=1e-4)


# The common adapter: a bare base (as published: ViTModel with its pooler, Dinov2Model, a full
# SiglipModel or CLIPModel) loaded into its family's image classifier with num_labels=K, LoRA on the
# encoder and the new classifier in modules_to_save. The adapter names modules under the
# classifier's prefix ("vit.layers.0...") and a classifier the base has not.
TEXT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=64,
            max_position_embeddings=16)
BARE_BASES = {
    "vit": (lambda: transformers.ViTModel(transformers.ViTConfig(**SMALL)), "ViTForImageClassification",
            ["q_proj", "v_proj", "fc1"]),
    "dinov2": (lambda: transformers.Dinov2Model(transformers.Dinov2Config(**SMALL)), "Dinov2ForImageClassification",
               ["q_proj", "v_proj", "fc2"]),
    "siglip": (lambda: transformers.SiglipModel(transformers.SiglipConfig(vision_config=SMALL, text_config=TEXT)),
               "SiglipForImageClassification", ["q_proj", "v_proj", "out_proj"]),
    "clip": (lambda: transformers.CLIPModel(transformers.CLIPConfig(vision_config=SMALL, text_config=TEXT)),
             "CLIPForImageClassification", ["q_proj", "k_proj", "fc1"]),
    "deit": (lambda: transformers.DeiTModel(transformers.DeiTConfig(**SMALL)), "DeiTForImageClassification",
             ["q_proj", "o_proj"]),
    "dinov2_registers": (lambda: transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(
        **SMALL, num_register_tokens=2)), "Dinov2WithRegistersForImageClassification", ["q_proj", "fc1"]),
    "metaclip_2": (lambda: transformers.MetaClip2Model(transformers.MetaClip2Config(
        vision_config=SMALL, text_config=dict(TEXT, bos_token_id=0, eos_token_id=2))),
        "MetaClip2ForImageClassification", ["v_proj", "fc2"]),
}


def _bare_adapter(tmp_path, make, task_class, targets, **lora):
    """(the peft model, its adapter folder) of a bare base (BARE_BASES' entry), trained as people train it."""
    bare = make()
    perturb_torch(bare, seed=7)
    bare.save_pretrained(tmp_path / "base")
    task = getattr(transformers, task_class).from_pretrained(tmp_path / "base", num_labels=5)
    adapted = peft.get_peft_model(task, peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": targets,
                                                           "modules_to_save": ["classifier"], **lora}))
    generator = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for _, parameter in adapted.named_parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    adapted.eval().save_pretrained(tmp_path / "adapter")
    return adapted, tmp_path / "adapter"


@pytest.mark.parametrize("family", sorted(BARE_BASES))
def test_an_adapter_trained_on_a_bare_base_s_classifier_gives_peft_s_logits(family, tmp_path):
    """ViT (its pooler unused by the classifier), DINOv2 (class token beside the patch mean), SigLIP
    (the tokens' mean, not its pooling head) and CLIP (the patch tokens' mean before any norm)."""
    adapted, folder = _bare_adapter(tmp_path, *BARE_BASES[family])
    saved = load_file(folder / "adapter_model.safetensors")
    assert "base_model.model.classifier.weight" in saved  # the shape people make: a classifier the base has not
    prefixes = r"base_model\.model\.(vit|deit|dinov2|dinov2_with_registers|vision_model)\."
    assert any(re.match(prefixes, k) for k in saved)
    model = keras_vit.from_pretrained(str(folder))
    assert model.num_classes == 5
    expected = _logits(adapted)
    np.testing.assert_allclose(model(IMAGES), expected, atol=1e-4, rtol=1e-4)
    with adapted.disable_adapter(), torch.no_grad():  # the updates count: the classifier alone differs
        assert np.abs(adapted(pixel_values=pixels(IMAGES)).logits.numpy() - expected).max() > 1e-2


@pytest.mark.parametrize("family", ["vit", "dinov2", "clip"])
def test_a_new_head_on_a_bare_base_is_its_family_s_classifier(family, tmp_path):
    """from_pretrained(base, num_classes=K) builds what *ForImageClassification.from_pretrained(base,
    num_labels=K) does (the heads given the same random values: a new one is zero in both)."""
    make, task_class, _ = BARE_BASES[family]
    bare = make()
    perturb_torch(bare, seed=4)
    bare.save_pretrained(tmp_path / "base")
    hf = getattr(transformers, task_class).from_pretrained(tmp_path / "base", num_labels=3).eval()
    model = keras_vit.from_pretrained(str(tmp_path / "base"), num_classes=3)
    kernel = np.random.default_rng(0).normal(size=model.head.kernel.shape).astype("float32")
    model.head.kernel.assign(kernel)
    with torch.no_grad():
        hf.classifier.weight.copy_(torch.from_numpy(kernel.T))
        hf.classifier.bias.zero_()
    np.testing.assert_allclose(model(IMAGES), _logits(hf), atol=1e-4, rtol=1e-4)


def test_a_run_that_read_its_bare_base_as_it_is_still_rebuilds_from_its_adapter_file(tmp_path):
    """Runs from before a new head read its family's classifier kept a bare ViTModel's pooler
    (pre_logits): load_adapter reads their base as they did."""
    from keras_vit.runs.adapter import write_adapter
    from keras_vit.training import load_adapter
    from keras_vit.training.transfer import apply_weights, resolve_weights

    bare = transformers.ViTModel(transformers.ViTConfig(**SMALL))
    perturb_torch(bare, seed=5)
    bare.save_pretrained(tmp_path / "base")
    before = resolve_weights(str(tmp_path / "base"))  # as such a run read it
    assert before.source_config.representation_size
    vit = keras_vit.ViT(before.source_config.replace(lora_rank=2), image_size=32, num_classes=3)
    apply_weights(vit, before)
    rng = np.random.default_rng(6)
    for variable in vit.trainable_variables:  # the updates and the head, as trained
        variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))
    (tmp_path / "run").mkdir()
    write_adapter(tmp_path / "run", vit, str(tmp_path / "base"))
    np.testing.assert_allclose(load_adapter(tmp_path / "run")(IMAGES), vit(IMAGES), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("setting", [dict(use_bdlora={"n": 2}), dict(kasa_config={"r": 2}),
                                     dict(trainable_token_indices=[0, 1]), dict(arrow_config={"top_k": 2})])
def test_a_lora_variant_that_is_no_plain_update_is_refused_by_name(vit_adapter, tmp_path, setting):
    with pytest.raises(UserError, match=re.escape(f"({next(iter(setting))}")) as error:
        keras_vit.from_pretrained(str(_edited(vit_adapter[1], tmp_path, **setting)))
    assert "\n" not in str(error.value) and "merge it with peft" in str(error.value)


def test_an_adapter_trained_on_a_full_siglip2_s_classifier_gives_peft_s_logits(tmp_path):
    """SigLIP2 (NaFlex): a full Siglip2Model loaded into Siglip2ForImageClassification, the patches
    at each image's own grid."""
    from tests.test_hf_families import images, naflex

    config = transformers.Siglip2Config(vision_config=dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                                           intermediate_size=80, patch_size=8, num_patches=16),
                                        text_config=TEXT)
    adapted, folder = _bare_adapter(tmp_path, lambda: transformers.Siglip2Model(config),
                                    "Siglip2ForImageClassification", ["q_proj", "fc1"])
    x = images(32)
    with torch.no_grad():
        expected = naflex(8, lambda hf, inputs: hf(**inputs).logits)(adapted, x).numpy()
    np.testing.assert_allclose(keras_vit.from_pretrained(str(folder))(x), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_2", "olora", "corda", "loftq", "lora_ga"])
def test_an_adapter_whose_initialisation_changed_the_base_is_one_line(vit_adapter, tmp_path, init):
    with pytest.raises(UserError, match=re.escape(f"init_lora_weights={init!r}, which also changes the base")) as error:
        keras_vit.from_pretrained(str(_edited(vit_adapter[1], tmp_path, init_lora_weights=init)))
    assert "\n" not in str(error.value) and ("merge it with peft" if init == "loftq"
                                             else "path_initial_model_for_weight_conversion") in str(error.value)


def test_a_pissa_adapter_converted_by_peft_gives_its_logits_on_the_original_base(tmp_path):
    """PiSSA starts from the base's top singular directions and subtracts them from the base; peft's
    save_pretrained(path_initial_model_for_weight_conversion=...) writes it as an update of the
    original base (rank 2r, init_lora_weights True), which merges as any adapter."""
    base_model = transformers.ViTForImageClassification(transformers.ViTConfig(**SMALL, num_labels=5))
    perturb_torch(base_model, seed=9)
    base_model.save_pretrained(tmp_path / "base")
    adapted = peft.get_peft_model(transformers.ViTForImageClassification.from_pretrained(tmp_path / "base"),
                                  peft.LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights="pissa"))
    # The untrained adapter, as peft's recipe saves it first (marked plain, or peft subtracts it twice).
    adapted.peft_config["default"].init_lora_weights = True
    adapted.save_pretrained(tmp_path / "initial")
    adapted.peft_config["default"].init_lora_weights = "pissa"
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)) * 0.2)
    expected = _logits(adapted.eval())
    adapted.save_pretrained(tmp_path / "raw")
    with pytest.raises(UserError, match="init_lora_weights='pissa'"):
        keras_vit.from_pretrained(str(tmp_path / "raw"))
    adapted.save_pretrained(tmp_path / "converted",
                            path_initial_model_for_weight_conversion=str(tmp_path / "initial"))
    assert json.loads((tmp_path / "converted" / "adapter_config.json").read_text())["r"] == 4
    np.testing.assert_allclose(keras_vit.from_pretrained(str(tmp_path / "converted"))(IMAGES), expected,
                               atol=1e-4, rtol=1e-4)


def test_the_writer_keeps_the_base_s_revision_and_a_folder_s_absolute_path(tmp_path, monkeypatch):
    """peft loads base_model_name_or_path at `revision` (main when absent), from any directory."""
    from keras_vit.runs.adapter import peft_base
    from keras_vit.weights import download

    folder = tmp_path / "bases" / "vit"
    transformers.ViTModel(transformers.ViTConfig(**SMALL)).save_pretrained(folder)
    asked = []
    monkeypatch.setattr(download, "cached_file", lambda name, file, revision: asked.append((name, revision))
                        or str(folder / file))
    assert peft_base("hf:org/vit@v2.0")[::2] == ("org/vit", "v2.0") and asked == [("org/vit", "v2.0")]
    monkeypatch.chdir(tmp_path)
    assert peft_base("bases/vit").name == str(folder) and peft_base("bases/vit").revision is None


def test_the_reader_loads_the_base_at_the_adapter_s_revision(vit_adapter, tmp_path, monkeypatch):
    from keras_vit.weights import download

    base = json.loads((vit_adapter[1] / "adapter_config.json").read_text())["base_model_name_or_path"]
    asked = []
    monkeypatch.setattr(download, "hf_directory", lambda name, revision=None: asked.append((name, revision)) or base)
    model = keras_vit.from_pretrained(str(_edited(vit_adapter[1], tmp_path, base_model_name_or_path="org/vit",
                                                  revision="v2.0")))
    assert asked == [("org/vit", "v2.0")]
    np.testing.assert_allclose(model(IMAGES), _logits(vit_adapter[0]), atol=1e-4, rtol=1e-4)


def test_a_relative_base_is_found_beside_the_adapter_from_another_directory(vit_adapter, tmp_path, monkeypatch):
    """peft records the base as it was typed ("vit-base"); the project folder holding both, read from
    elsewhere, still finds it."""
    base = json.loads((vit_adapter[1] / "adapter_config.json").read_text())["base_model_name_or_path"]
    project = tmp_path / "project"
    shutil.copytree(base, project / "vit-base")
    shutil.copytree(vit_adapter[1], project / "vit-lora")
    settings = json.loads((project / "vit-lora" / "adapter_config.json").read_text())
    (project / "vit-lora" / "adapter_config.json").write_text(json.dumps({**settings,
                                                                          "base_model_name_or_path": "vit-base"}))
    monkeypatch.chdir(tmp_path)
    np.testing.assert_allclose(keras_vit.from_pretrained("project/vit-lora")(IMAGES), _logits(vit_adapter[0]),
                               atol=1e-4, rtol=1e-4)


def test_the_names_table_covers_every_family_read_and_written():
    from keras_vit.weights.hf_families import FAMILY_MODEL_TYPES
    from keras_vit.weights.hf_modules import BLOCKS, CLASSES

    assert set(BLOCKS) == FAMILY_MODEL_TYPES and set(CLASSES) == FAMILY_MODEL_TYPES


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
    assert settings["target_modules"] == [f"vit.layers.{i}.{module}" for i in range(2) for module in (
        "attention.o_proj", "attention.q_proj", "mlp.fc1", "mlp.fc2")] and settings["base_model_name_or_path"] == base
    hf = transformers.ViTForImageClassification.from_pretrained(base, num_labels=10, ignore_mismatched_sizes=True)
    adapted = peft.PeftModel.from_pretrained(hf, folder).eval()
    model = keras_vit.load_model(str(tmp_path / "run"))
    digits = np.random.default_rng(3).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    with torch.no_grad():
        expected = adapted(pixel_values=pixels(digits)).logits.numpy()
    np.testing.assert_allclose(model(digits), expected, atol=1e-4, rtol=1e-4)
    assert np.abs(model(digits)).max() > 1e-3  # the head moved: the comparison means something


def _tower_features(hf, digits):
    return hf(pixel_values=pixels(digits)).pooler_output.numpy()


def _image_features(hf, digits):  # a full CLIPModel's: the tower's, projected
    return hf.get_image_features(pixel_values=pixels(digits)).pooler_output.numpy()


def _logits_of(hf, digits):
    return hf(pixel_values=pixels(digits)).logits.numpy()


# (a random transformers base, the class the run's adapter applies to, what its adapted model gives,
# the modules the run's heads are): a run's new head on a base is its family's image classifier
# (a bare ViTModel's, Dinov2Model's, full CLIPModel's too), saved with the updates; a bare tower,
# which no classifier loads, gets the updates alone.
FAMILY_RUNS = {
    "deit_with_teacher": (lambda: transformers.DeiTForImageClassificationWithTeacher(
        transformers.DeiTConfig(**SMALL, num_labels=5)), "DeiTForImageClassificationWithTeacher", _logits_of,
        ["cls_classifier", "distillation_classifier"]),
    "dinov2_classifier": (lambda: transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(**SMALL, num_labels=5)), "Dinov2ForImageClassification", _logits_of, ["classifier"]),
    "dinov2_model": (lambda: transformers.Dinov2Model(transformers.Dinov2Config(**SMALL)),
                     "Dinov2ForImageClassification", _logits_of, ["classifier"]),
    "vit_model": (lambda: transformers.ViTModel(transformers.ViTConfig(**SMALL)), "ViTForImageClassification",
                  _logits_of, ["classifier"]),
    "siglip_classifier": (lambda: transformers.SiglipForImageClassification(
        transformers.SiglipConfig(vision_config=SMALL, num_labels=5)), "SiglipForImageClassification", _logits_of,
        ["classifier"]),
    "siglip_tower": (lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SMALL)),
                     "SiglipVisionModel", _tower_features, None),
    "clip_model": (lambda: transformers.CLIPModel(transformers.CLIPConfig(vision_config=SMALL, text_config=TEXT)),
                   "CLIPForImageClassification", _logits_of, ["classifier"]),
}


def _headless(model):
    from keras_vit.weights.npz import load_checkpoint, variables_by_key

    headless = keras_vit.ViT(model.config, image_size=model.image_size, include_top=False,
                             num_channels=model.num_channels)
    load_checkpoint(headless, {key: np.asarray(v) for key, v in variables_by_key(model).items()})
    return headless


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILY_RUNS))
def test_a_lora_run_from_a_family_folder_writes_an_adapter_peft_loads(family, tmp_path):
    """DeiT (two heads), DINOv2, SigLIP and CLIP bases: the run's WORKDIR/peft names the class it
    applies to (adapter_config.json's auto_mapping); peft applies it to that class of the base,
    adapting only the modules the run adapted (not a full CLIPModel's text tower, nor SigLIP's
    pooling head), and gives the run's logits (its heads saved) or its features (the updates alone)."""
    from keras_vit.training import TrainConfig, train

    make, class_name, output, heads = FAMILY_RUNS[family]
    base_model = make()
    perturb_torch(base_model, seed=4)
    base_model.save_pretrained(tmp_path / "base")
    config = TrainConfig.create("finetune", weights=str(tmp_path / "base"), dataset="mnist5k", image_size=32, steps=2,
                                batch_size=8, warmup_steps=0, learning_rate=0.05, eval_batch_size=100,
                                workdir=str(tmp_path / "run"), lora_rank=2, lora_alpha=3,
                                lora_targets=("query", "value", "out", "mlp"), progress=False, jit_compile=False,
                                strategy="default")
    folder = train(config)["peft_adapter_path"]
    settings = json.loads((tmp_path / "run" / "peft" / "adapter_config.json").read_text())
    assert settings["auto_mapping"]["base_model_class"] == class_name
    assert settings["modules_to_save"] == heads and settings["base_model_name_or_path"] == str(tmp_path / "base")
    cls = getattr(transformers, class_name)
    hf = (cls.from_pretrained(tmp_path / "base", num_labels=10, ignore_mismatched_sizes=True) if heads
          else cls.from_pretrained(tmp_path / "base"))
    adapted = peft.PeftModel.from_pretrained(hf, folder).eval()
    model = keras_vit.load_model(str(tmp_path / "run"))
    if not heads:  # the run's encoder without its head: what the tower gives
        model = _headless(model)
    with torch.no_grad():
        expected = output(adapted, IMAGES)
    np.testing.assert_allclose(model(IMAGES), expected, atol=1e-4, rtol=1e-4)
    # and read back: the folder as a checkpoint is the run's model (its head included)
    read = keras_vit.from_pretrained(folder) if heads else keras_vit.from_pretrained(folder, include_top=False)
    np.testing.assert_allclose(read(IMAGES), expected, atol=1e-4, rtol=1e-4)
    if heads:  # the class names, which peft does not keep, beside its files
        assert read.labels == (tmp_path / "run" / "labels.txt").read_text().split()
    # Every tensor written is where peft keeps it, and peft adapted nothing else (two steps move a
    # tower's updates little, so the outputs alone could not tell an update left out).
    loaded = {key.replace(".default.", "."): value.numpy() for key, value in adapted.state_dict().items()}
    written = load_file(tmp_path / "run" / "peft" / "adapter_model.safetensors")
    assert len(written) == 2 * 5 * SMALL["num_hidden_layers"] + 2 * len(heads or [])  # A and B of 5 modules a block
    assert {key for key in loaded if ".lora_" in key} == {key for key in written if ".lora_" in key}
    for key, value in written.items():
        module, leaf = key.rsplit(".", 1)
        saved = f"{module}.modules_to_save.{leaf}" if module.rsplit(".", 1)[-1] in (heads or []) else key
        np.testing.assert_array_equal(loaded[saved], value)
    assert max(np.abs(v).max() for k, v in written.items() if "lora_B" in k) > 0


def test_a_swiglu_fc1_update_is_two_modules_sharing_a(tmp_path):
    """DINOv2's SwiGLU holds its gate and up projections as one keras_vit fc1 (the gate's outputs
    first) and two transformers modules: each gets A, and its half of B."""
    from keras_vit.runs.adapter import PeftBase, write_peft_adapter

    base = PeftBase("facebook/dinov2-giant", {"model_type": "dinov2", "architectures": ["Dinov2Model"],
                                              "use_swiglu_ffn": True})
    config = keras_vit.ViTConfig(patch_size=8, hidden_size=24, mlp_dim=32, num_heads=2, num_layers=1,
                                 mlp_activation="swiglu", lora_rank=2)
    from keras_vit.weights.layout import variables_by_key

    model = keras_vit.ViT(config.replace(lora_targets=("query", "mlp")), image_size=16, num_classes=3)
    variables = variables_by_key(model)
    a, b = (next(v for k, v in variables.items() if k.endswith(f"MlpBlock_3/Dense_0/lora_{f}")) for f in "ab")
    b.assign(np.random.default_rng(0).normal(size=b.shape))
    folder = write_peft_adapter(tmp_path, model, base)
    written = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert written["auto_mapping"]["base_model_class"] == "Dinov2Model" and written["modules_to_save"] is None
    assert written["target_modules"] == [f"encoder.layer.0.{m}" for m in (
        "attention.q_proj", "mlp.down_proj", "mlp.gate_proj", "mlp.up_proj")]
    tensors = load_file(f"{folder}/adapter_model.safetensors")
    mlp = "base_model.model.encoder.layer.0.mlp."
    for half, module in enumerate(("gate_proj", "up_proj")):
        np.testing.assert_array_equal(tensors[f"{mlp}{module}.lora_A.weight"], np.asarray(a).T)
        np.testing.assert_array_equal(tensors[f"{mlp}{module}.lora_B.weight"],
                                      np.asarray(b)[:, half * 32:(half + 1) * 32].T)


# The families whose blocks peft sees under other names than ViT's (keras_vit.weights.hf_modules):
# test_hf_families' case -> the LoRA targets. DINOv3's blocks sit under "model." in memory only; a
# gated MLP's fc1 is keras_vit's one projection and transformers' two modules (DINOv2's SwiGLU
# one tensor on disk, DINOv3's and AIMv2's two).
LAYOUT_CASES = {
    "dinov2_swiglu_classifier": ("query", "value", "mlp"),
    "dinov3": ("query", "key", "value", "out", "mlp"),
    "dinov3_gated": ("query", "value", "out", "mlp"),
    "aimv2_vision": ("query", "key", "value", "out", "mlp"),
    "metaclip_2_vision_projection": ("query", "value", "mlp"),
    "siglip2_classifier": ("query", "value", "mlp"),
}


@pytest.mark.parametrize("name", sorted(LAYOUT_CASES))
def test_a_family_s_updates_in_peft_s_layout_give_its_outputs_in_peft_and_back(name, tmp_path):
    """No training (the runs above are the trainer's part): a LoRA model over the base, its updates
    and head random, written in peft's layout. peft applies the folder to the class it names and
    gives the LoRA model's outputs; keras_vit.from_pretrained of the folder (transformers 5's
    names back to the files') gives them too."""
    from keras_vit.runs.adapter import peft_base, write_peft_adapter
    from keras_vit.weights.layout import is_lora_key, variables_by_key
    from tests.test_hf_families import CASES, images, saved

    hf, directory = saved(tmp_path, name)
    model = keras_vit.from_pretrained(str(directory), lora_rank=2, lora_alpha=3, lora_targets=LAYOUT_CASES[name])
    rng = np.random.default_rng(5)
    for key, variable in variables_by_key(model).items():
        if variable.trainable:  # the updates (B starts at zero) and the head
            assert is_lora_key(key) or key.startswith("head")
            variable.assign(np.asarray(variable) + rng.normal(0, 0.3, variable.shape).astype("float32"))
    folder = write_peft_adapter(tmp_path / "run", model, peft_base(str(directory)))
    settings = json.loads((tmp_path / "run" / "peft" / "adapter_config.json").read_text())
    assert settings["auto_mapping"]["base_model_class"] == type(hf).__name__
    output, size = CASES[name][1], CASES[name][3]
    x = images(size)
    want = np.asarray(model(x))
    adapted = peft.PeftModel.from_pretrained(type(hf).from_pretrained(directory), folder).eval()
    adapted_modules = {key.split(".lora_")[0] for key, _ in adapted.named_parameters() if ".lora_" in key}
    assert {f"base_model.model.{module}" for module in settings["target_modules"]} == adapted_modules
    with torch.no_grad():
        np.testing.assert_allclose(output(adapted, x).numpy(), want, atol=1e-4, rtol=0)
        assert np.abs(output(hf, x).numpy() - want).max() > 1e-2  # the updates count
    np.testing.assert_allclose(np.asarray(keras_vit.from_pretrained(folder)(x)), want, atol=1e-4, rtol=0)
