"""ViT's relatives as a user meets them: a transformers DINOv2-with-registers, DINOv3,
DeiT-with-teacher or CLIP vision directory fine-tuned with `keras-vit train
--weights DIR`, then predicted, inspected and exported from the run, every
command exiting 0 on real photos (scikit-image's). Tiny random checkpoints
(perturbed weights), a few steps each."""

import importlib.util
import json
import math

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
skimage_data = pytest.importorskip("skimage.data")

from keras_vit.tasks import ModelPlan
from keras_vit.cli import main  # noqa: E402
from tests.sources_helpers import perturb_torch  # noqa: E402

CLASSES = ("astronaut", "chelsea", "coffee")
SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, patch_size=4,
             image_size=32)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three classes of 10 crops of one photo each (9 train, 1 held out), 40 px JPEGs."""
    root = tmp_path_factory.mktemp("photos")
    for name in CLASSES:
        (root / name).mkdir()
        image = getattr(skimage_data, name)()
        height, width = image.shape[:2]
        for i in range(10):
            side = min(height, width) // 2 + 12 * i
            top, left = (height - side) * i // 10, (width - side) * (9 - i) // 10
            crop = Image.fromarray(image[top:top + side, left:left + side]).resize((40, 40), Image.BILINEAR)
            crop.save(root / name / f"{i}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def dinov2(tmp_path_factory):
    """A DINOv2-with-registers directory (class + 2 registers, LayerScale 0.5) and its torch model,
    written once for the tests that start from it (none writes into it)."""
    checkpoint = tmp_path_factory.mktemp("checkpoints") / "dinov2"
    config = transformers.Dinov2WithRegistersConfig(**SMALL, num_register_tokens=2, layerscale_value=0.5)
    return checkpoint, _saved(transformers.Dinov2WithRegistersModel(config), 0, checkpoint)


def _saved(module, seed, directory):
    perturb_torch(module.eval(), seed, scale=0.2)
    module.save_pretrained(directory)
    return module


def _train(args, workdir, capsys, steps, jit=True):
    # jit=False: the step without XLA (its compile is most of a 2-step run's time), where XLA is
    # not what the test is about; the DINOv2 run keeps the default (XLA) of a user's command.
    code = main(["train", *args, "--steps", str(steps), "--batch-size", "4", "--image-size", "32",
                 "--warmup-steps", "0", "--workdir", str(workdir), "--no-progress", "--strategy", "default",
                 "--fewshot-shots", "1", *([] if jit else ["--no-jit"])])  # the few-shot linear probe too
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return json.loads((workdir / "results.json").read_text())


def _recipe_run(checkpoint, recipe, photos, run, capsys):
    """Two steps of `recipe` from `checkpoint` at a learning rate that moves nothing visibly; the run's model."""
    from keras_vit.runs import load_model

    code = main(["train", "--weights", str(checkpoint), "--dataset", f"folder:{photos}", "--recipe", recipe,
                 "--steps", "2", "--batch-size", "4", "--image-size", "32", "--warmup-steps", "1",
                 "--learning-rate", "1e-6", "--workdir", str(run), "--no-progress", "--strategy", "default",
                 "--no-jit"])
    assert code == 0, capsys.readouterr().err[-3000:]
    return load_model(str(run))


def test_dinov2_with_registers_trains_predicts_inspects_and_exports(photos, dinov2, tmp_path, capsys):
    import keras_vit
    from keras_vit.images import model_inputs

    checkpoint, torch_model = dinov2

    # The checkpoint as a model: class + 2 registers before the patches, ImageNet's mean and std.
    model = keras_vit.from_pretrained(str(checkpoint))
    assert (model.num_prefix_tokens, model.config.pixel_normalization) == (3, "imagenet")
    pixels = np.stack([np.asarray(Image.open(photos / name / "0.jpg").resize((32, 32), Image.BILINEAR))
                       for name in CLASSES]).astype(np.float32)
    normalised = (pixels / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    with torch.no_grad():
        want = torch_model(pixel_values=torch.from_numpy(normalised.transpose(0, 3, 1, 2).astype(np.float32)))
    np.testing.assert_allclose(model.predict(model_inputs(model, pixels), verbose=0),
                               want.pooler_output.numpy(), atol=2e-4)

    # The backbone has no head: predict names the way on (fine-tune first) instead of failing.
    assert main(["predict", str(checkpoint), str(photos / "chelsea" / "0.jpg")]) == 2
    err = capsys.readouterr().err
    assert "no classification head" in err and "keras-vit train --weights MODEL" in err and "Traceback" not in err

    run = tmp_path / "run"
    results = _train(["--weights", str(checkpoint), "--dataset", f"folder:{photos}"], run, capsys, steps=4)
    assert results["steps"] == 4 and np.isfinite(results["eval"]["loss"]) and "1shot" in results["fewshot"]
    plan = json.loads((run / "config.json").read_text())["plan"]
    assert {"op": "to_model_range", "normalization": "imagenet"} in plan["augmentation"]

    assert main(["predict", str(run), str(photos / "chelsea" / "0.jpg"), "--json", "--no-progress"]) == 0
    (predicted,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted(predicted["labels"]) == sorted(CLASSES) and sum(predicted["probabilities"]) == pytest.approx(1)

    figures = tmp_path / "figures"
    assert main(["inspect", str(run), "--image", str(photos), "--recursive", "--out", str(figures)]) == 0
    capsys.readouterr()
    assert (figures / "rollout.png").exists() and (figures / "attention_heads.png").exists()

    formats = "saved_model,tflite" if importlib.util.find_spec("ai_edge_litert") else "saved_model"
    exports = tmp_path / "exports"
    code = main(["export", str(run), "--formats", formats, "--data", str(photos), "--out", str(exports),
                 "--latency-runs", "2"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "export passed" in out.out, out.out
    report = json.loads((exports / "report.json").read_text())
    assert report["passed"] and [row["format"] for row in report["artifacts"] if row["passed"]] == formats.split(",")


@pytest.mark.parametrize("family", ["deit_with_teacher", "clip_with_projection"])
def test_a_family_checkpoint_fine_tunes(family, photos, tmp_path, capsys):
    """DeiT's two heads (the distillation head dropped with the head, both
    starting at -log(classes) for the sigmoid loss, few-shot features read
    from the class token, as without a head); CLIP's projection kept as the encoder's."""
    from keras_vit.tasks.classification import ClassificationTask
    from keras_vit.training.transfer import apply_weights, resolve_weights

    checkpoint = tmp_path / family
    if family == "deit_with_teacher":
        module = transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**SMALL, num_labels=5))
    else:
        module = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**SMALL, projection_dim=16))
    _saved(module, 1, checkpoint)

    initial = resolve_weights(str(checkpoint))
    assert not any(key.startswith(("head/", "head_dist/")) for key in initial.weights)
    task = ClassificationTask(loss="sigmoid")
    model = task.build_model(ModelPlan(initial.source_config, (32, 32), 3, 3))
    apply_weights(model, initial)
    if family == "deit_with_teacher":
        for dense in (model.head.head, model.head.head_dist):
            np.testing.assert_allclose(dense.bias.numpy(), -math.log(3), rtol=1e-6)
            assert not np.any(dense.kernel.numpy())
        assert model.config.pixel_normalization == "imagenet"
    else:
        assert model.config.projection_size == 16 and model.config.pixel_normalization == "clip"
        np.testing.assert_allclose(model.head.bias.numpy(), -math.log(3), rtol=1e-6)
    features = task.feature_model(model)
    assert tuple(features.output_shape) == (None, 16 if family == "clip_with_projection" else 32)

    results = _train(["--weights", str(checkpoint), "--dataset", f"folder:{photos}", "--loss", "sigmoid"],
                     tmp_path / "run", capsys, steps=2, jit=False)
    assert results["steps"] == 2 and np.isfinite(results["eval"]["loss"]) and "1shot" in results["fewshot"]


def test_weights_by_hub_name(photos, tmp_path, capsys, monkeypatch):
    # `--weights hf:ORG/NAME` as the family pages show it (the download stubbed out: no internet in tests).
    from keras_vit.weights import download

    checkpoint = tmp_path / "siglip"
    _saved(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SMALL)), 2, checkpoint)
    monkeypatch.setattr(download, "hf_directory", lambda repo, revision=None: str(checkpoint))
    results = _train(["--weights", "hf:google/tiny-siglip", "--dataset", f"folder:{photos}"], tmp_path / "run",
                     capsys, steps=2, jit=False)
    assert results
    from keras_vit.runs import load_model

    model = load_model(str(tmp_path / "run"))
    assert model.config.classifier == "map" and model.num_classes == 3


@pytest.mark.parametrize("recipe", ["augreg", "plain_baseline", "deit", "finetune_ld", "masked_patch"])
def test_every_recipe_starts_from_a_family_checkpoint(recipe, photos, dinov2, tmp_path, capsys):
    # Pre-training recipes keep the checkpoint's architecture (no untrained representation layer
    # on its features); masked patch prediction loads the encoder into the ViT it wraps. The step
    # without XLA, as the recipe x data matrix runs them (tests/test_recipe_matrix.py).
    checkpoint, torch_model = dinov2
    model = _recipe_run(checkpoint, recipe, photos, tmp_path / "run", capsys)
    assert model.config.representation_size is None and model.num_prefix_tokens == 3
    # The run started from the checkpoint (a learning rate of 1e-6 moves nothing visibly).
    registers = torch_model.embeddings.register_tokens.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.register_tokens.tokens), registers, atol=1e-3)


@pytest.fixture(scope="module")
def dinov3(tmp_path_factory):
    """A DINOv3 directory (class + 2 registers, rotary positions, no key bias) and its torch model."""
    checkpoint = tmp_path_factory.mktemp("checkpoints") / "dinov3"
    config = transformers.DINOv3ViTConfig(**SMALL, num_register_tokens=2, layerscale_value=0.5)
    return checkpoint, _saved(transformers.DINOv3ViTModel(config), 3, checkpoint)


def test_dinov3_at_its_own_aspect_ratio_trains_predicts_inspects_and_exports(photos, dinov3, tmp_path, capsys):
    import keras_vit
    from keras_vit.images import model_inputs

    checkpoint, torch_model = dinov3
    # Any size without a rebuild: a 32 x 48 photo through the dynamic model gives transformers' pooled token.
    model = keras_vit.from_pretrained(str(checkpoint), dynamic_image_size=True)
    pixels = np.asarray(Image.open(photos / "coffee" / "0.jpg").resize((48, 32), Image.BILINEAR), np.float32)[None]
    normalised = (pixels / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    with torch.no_grad():
        want = torch_model(pixel_values=torch.from_numpy(normalised.transpose(0, 3, 1, 2).astype(np.float32)))
    np.testing.assert_allclose(np.asarray(model(model_inputs(model, pixels))), want.pooler_output.numpy(), atol=2e-4)

    run = tmp_path / "run"
    results = _train(["--weights", str(checkpoint), "--dataset", f"folder:{photos}"], run, capsys, steps=3)
    assert results["steps"] == 3 and np.isfinite(results["eval"]["loss"])
    assert main(["predict", str(run), str(photos / "chelsea" / "0.jpg"), "--json", "--no-progress"]) == 0
    (predicted,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted(predicted["labels"]) == sorted(CLASSES)
    figures = tmp_path / "figures"
    assert main(["inspect", str(run), "--image", str(photos / "chelsea" / "0.jpg"), "--out", str(figures)]) == 0
    capsys.readouterr()
    assert (figures / "rollout.png").exists()
    formats = "saved_model,tflite" if importlib.util.find_spec("ai_edge_litert") else "saved_model"
    code = main(["export", str(run), "--formats", formats, "--data", str(photos), "--out", str(tmp_path / "exports"),
                 "--latency-runs", "2"])
    out = capsys.readouterr()
    assert code == 0 and "export passed" in out.out, out.err[-3000:]


@pytest.mark.parametrize("recipe", ["finetune_ld", "masked_patch"])
def test_dinov3_starts_the_recipes_that_read_its_parts(recipe, photos, dinov3, tmp_path, capsys):
    # Layer decay reads the parts (the rotary embedding has no weights to place); masked patch
    # prediction calls the encoder itself, with the angles of the images' grid.
    checkpoint, torch_model = dinov3
    model = _recipe_run(checkpoint, recipe, photos, tmp_path / "run", capsys)
    assert model.config.position_embedding == "rope" and model.num_prefix_tokens == 3
    registers = torch_model.embeddings.register_tokens.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.register_tokens.tokens), registers, atol=1e-3)


def _timm_dinov3(directory):
    """A DINOv3 in timm's layout (timm/models/eva.py names, timm's config.json) from a random transformers
    model: timm's mean of the patch tokens, no qkv bias."""
    from safetensors.numpy import load_file, save_file

    from tests.test_timm_families import timm_dinov3

    config = transformers.DINOv3ViTConfig(**dict(SMALL, num_hidden_layers=2), num_register_tokens=2,
                                          query_bias=False, value_bias=False)
    _saved(transformers.DINOv3ViTModel(config), 5, directory / "hf")
    tensors = timm_dinov3(load_file(str(directory / "hf" / "model.safetensors")))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "architecture": "vit_small_patch16_dinov3", "num_classes": 0, "model_args": {"num_heads": 2},
        "pretrained_cfg": {"input_size": [3, 32, 32], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}))


FRONTIER = {
    # SigLIP2 (NaFlex) trains at one size: the MAP head is the head layer decay leaves at the full rate.
    "siglip2": lambda d: _saved(transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, patch_size=4,
        num_patches=64)), 4, d),
    # AIMv2: RMSNorm, no projection biases, its attention pooling in the head group.
    "aimv2": lambda d: _saved(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**SMALL)), 6, d),
    "dinov3_timm": _timm_dinov3,
}


@pytest.mark.parametrize("family", sorted(FRONTIER))
def test_the_frontier_families_fine_tune_with_layer_decay_and_predict(family, photos, tmp_path, capsys):
    # The recipe that reads the parts most (layer-wise decay: every weight's depth), from each newer
    # family's checkpoint, then predict from the run, as a user does.
    import keras_vit

    checkpoint = tmp_path / family
    checkpoint.mkdir()
    FRONTIER[family](checkpoint)
    loaded = keras_vit.from_pretrained(str(checkpoint), include_top=False)
    model = _recipe_run(checkpoint, "finetune_ld", photos, tmp_path / "run", capsys)
    capsys.readouterr()
    assert model.config.classifier == loaded.config.classifier and model.num_classes == len(CLASSES)
    # The run started from the checkpoint (a learning rate of 1e-6 moves nothing visibly).
    np.testing.assert_allclose(np.asarray(model.patch_embedding.projection.kernel),
                               np.asarray(loaded.patch_embedding.projection.kernel), atol=1e-3)
    assert main(["predict", str(tmp_path / "run"), str(photos / "chelsea" / "0.jpg"), "--json", "--no-progress"]) == 0
    (predicted,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted(predicted["labels"]) == sorted(CLASSES)
