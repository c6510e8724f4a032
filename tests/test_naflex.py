"""SigLIP2's NaFlex through the command-line paths: `predict` reads each photo at its own
NaFlex size (its aspect ratio kept, the most patches the table holds) and gives what
transformers gives for those pixels; the SavedModel's bytes signature decodes, sizes and
classifies each image as `predict` does. (The model's exactness, padded batches and the
size rule against transformers' own: tests/test_hf_families.py.)"""

import numpy as np
import pytest
import torch
from PIL import Image

import keras_vit
from keras_vit.model.naflex import naflex_pixels
from tests.test_hf_families import CASES, naflex_inputs, saved

SHAPES = ((30, 50), (64, 20), (32, 32), (9, 200))  # wide, tall, the table's own, a sliver


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A perturbed Siglip2ForImageClassification (8 x 8 table, patch 4), keras_vit's model of it,
    and PNG files of four aspect ratios."""
    tmp = tmp_path_factory.mktemp("naflex")
    hf, directory = saved(tmp, "siglip2_classifier", positions=5.0)
    model = keras_vit.from_pretrained(str(directory))
    rng = np.random.default_rng(0)
    files = []
    for i, shape in enumerate(SHAPES):
        files.append(str(tmp / f"photo{i}.png"))
        Image.fromarray(rng.integers(0, 256, size=(*shape, 3), dtype=np.uint8)).save(files[-1])
    return hf, model, files


def test_predict_reads_each_photo_at_its_own_naflex_size(classifier):
    from keras_vit.images import decode
    from keras_vit.inspection.predict import predict_files

    hf, model, files = classifier
    predictions, failures = predict_files(model, files, top_k=5, batch_size=3)  # two padded batches
    assert not failures and [p.path for p in predictions] == files
    pixels = [naflex_pixels(decode(f, 3), model) for f in files]
    # Each at the size transformers' processor gives it: at most 64 patches of 4 px, its aspect ratio kept.
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    assert [p.shape[:2] for p in pixels] == [get_image_size_for_max_num_patches(*s, 4, 64) for s in SHAPES]
    assert pixels[0].shape[:2] == (24, 40) and pixels[3].shape[:2] == (8, 128)
    with torch.no_grad():
        logits = hf(**naflex_inputs([p / 127.5 - 1 for p in pixels], CASES["siglip2_classifier"][4])).logits
    want = torch.softmax(logits, -1).numpy()
    for prediction, row in zip(predictions, want):
        np.testing.assert_allclose(prediction.probabilities, row[prediction.indices], atol=1e-5, rtol=0)
    assert np.ptp(want, axis=0).max() > 1e-3  # the photos get answers of their own


@pytest.mark.slow
def test_serving_bytes_classifies_each_image_at_its_own_aspect_ratio(classifier, tmp_path):
    import tensorflow as tf

    from keras_vit.export import export
    from keras_vit.inspection.predict import predict_files

    _, model, files = classifier
    pixels = np.random.default_rng(1).uniform(0, 255, size=(4, 32, 32, 3)).astype("float32")
    report = export(model, "saved_model", str(tmp_path), validation_data=pixels, name="naflex", latency_runs=1,
                    verbose=False)
    assert report["passed"]
    served = tf.saved_model.load(report["artifacts"][0]["path"]).signatures["serving_bytes"]
    probabilities = served(image_bytes=tf.constant([open(f, "rb").read() for f in files]))["probabilities"].numpy()
    predictions, _ = predict_files(model, files, top_k=5)
    for prediction, row in zip(predictions, probabilities):
        np.testing.assert_allclose(row[prediction.indices], prediction.probabilities, atol=1e-6, rtol=0)


def test_predict_pads_like_shapes_together_within_twice_the_patch_budget():
    from keras_vit.model.naflex import batches_by_shape

    grids = [(8, 32), (32, 8), (16, 16), (1, 256), (256, 1), (9, 28), (30, 8)]
    batches = batches_by_shape(grids, 2 * 256, batch_size=3)
    assert sorted(i for batch in batches for i in batch) == list(range(len(grids)))  # each image once
    for batch in batches:
        rows, cols = max(grids[i][0] for i in batch), max(grids[i][1] for i in batch)
        assert len(batch) <= 3 and (len(batch) == 1 or rows * cols <= 512), (batch, rows, cols)
    assert [1, 6] in batches or [6, 1] in batches  # the two tall ones share a batch


# --- the patch budget (transformers' max_num_patches) as a setting: no rebuild, the table resized once ---

BUDGET_NAMES = {0: "ant", 1: "bee", 2: "cat"}
BUDGET_SHAPES = ((300, 451), (500, 200), (64, 64))  # wide, tall, small (enlarged at 1024)


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory):
    """A perturbed tiny Siglip2ForImageClassification (32 wide, 2 blocks, patch 16, an 8 x 8 table:
    64 patches, where the published towers have 256), keras_vit's model of it (default size: the
    table's), and PNG photos of three aspect ratios, one per class folder."""
    import transformers

    from tests.sources_helpers import perturb_torch

    tmp = tmp_path_factory.mktemp("budget")
    torch.manual_seed(0)
    config = transformers.Siglip2Config(
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                           patch_size=16, num_patches=64),
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
                         vocab_size=50, bos_token_id=0, eos_token_id=2, pad_token_id=1),
        num_labels=3, id2label=BUDGET_NAMES, label2id={v: k for k, v in BUDGET_NAMES.items()})
    hf = transformers.Siglip2ForImageClassification(config).eval()
    perturb_torch(hf, 1)  # nothing zero by construction
    with torch.no_grad():  # a large table, so that resizing it twice (or not at all) would show
        hf.vision_model.embeddings.position_embedding.weight.mul_(5.0)
    hf.save_pretrained(tmp / "hf")
    model = keras_vit.from_pretrained(str(tmp / "hf"))
    rng = np.random.default_rng(0)
    files = []
    for shape, name in zip(BUDGET_SHAPES, BUDGET_NAMES.values()):
        (tmp / "data" / name).mkdir(parents=True)
        files.append(str(tmp / "data" / name / "photo.png"))
        Image.fromarray(rng.integers(0, 256, size=(*shape, 3), dtype=np.uint8)).save(files[-1])
    return hf, model, files, tmp


def _processor_logits(hf, pixels, budget):
    """transformers' Siglip2ImageProcessor (the PIL backend: no torchvision here) then the model, on
    images already at their NaFlex size (its resize is then the identity: the pixels are the same)."""
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    inputs = Siglip2ImageProcessorPil(max_num_patches=budget, patch_size=16)(images=list(pixels), return_tensors="pt")
    assert (inputs["spatial_shapes"] * 16).tolist() == [list(p.shape[:2]) for p in pixels]
    with torch.no_grad():
        return hf(**inputs).logits.numpy()


@pytest.mark.parametrize("budget", [256, 1024])
def test_a_patch_budget_gives_transformers_processor_and_model_s_answers(budgeted, budget):
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    from keras_vit.images import decode
    from keras_vit.inspection.predict import predict_files
    from keras_vit.model.naflex import outputs_naflex

    hf, model, files, _ = budgeted
    assert model.grid_size == (8, 8)  # the checkpoint's table, not rebuilt for the budget
    photos = [decode(f, 3) for f in files]
    pixels = [naflex_pixels(photo, model, max_num_patches=budget) for photo in photos]
    own = Siglip2ImageProcessorPil(max_num_patches=budget, patch_size=16)(images=photos, return_tensors="pt")
    assert [p.shape[:2] for p in pixels] == [tuple(s) for s in (own["spatial_shapes"] * 16).tolist()]
    want = _processor_logits(hf, pixels, budget)
    got = outputs_naflex(model, pixels, max_num_patches=budget)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    predictions, failures = predict_files(model, files, top_k=3, max_num_patches=budget)
    probabilities = torch.softmax(torch.from_numpy(want), -1).numpy()
    assert not failures
    for prediction, row in zip(predictions, probabilities):
        np.testing.assert_allclose(prediction.probabilities, row[prediction.indices], atol=1e-5, rtol=0)
    assert np.ptp(want, axis=0).max() > 1e-3  # the photos get answers of their own


def test_the_default_budget_is_the_table_s(budgeted):
    from keras_vit.model.naflex import patch_budget

    _, model, files, _ = budgeted
    photo = np.zeros((300, 451, 3), np.uint8)
    assert patch_budget(model) == 64
    assert naflex_pixels(photo, model).shape == naflex_pixels(photo, model, max_num_patches=64).shape == (96, 160, 3)


def test_predict_and_evaluate_take_max_num_patches(budgeted, capsys):
    import json

    from keras_vit.cli import main
    from keras_vit.images import decode

    hf, model, files, tmp = budgeted
    pixels = [naflex_pixels(decode(f, 3), model, max_num_patches=1024) for f in files]
    want = torch.softmax(torch.from_numpy(_processor_logits(hf, pixels, 1024)), -1).numpy()
    assert main(["predict", str(tmp / "hf"), *files, "--max-num-patches", "1024", "--json", "--top", "3"]) == 0
    for line, row in zip(capsys.readouterr().out.splitlines(), want):
        answer = json.loads(line)
        np.testing.assert_allclose(answer["probabilities"], row[answer["indices"]], atol=1e-5, rtol=0)
    assert main(["evaluate", str(tmp / "hf"), str(tmp / "data"), "--max-num-patches", "1024", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["images"] == 3
    assert figures["top1"] == pytest.approx(np.mean(want.argmax(1) == np.arange(3)))
    assert {name: c["top1"] for name, c in figures["per_class"].items()} == \
        {name: float(want[i].argmax() == i) for i, name in BUDGET_NAMES.items()}


def test_a_budget_that_cannot_apply_is_one_line(budgeted, tmp_path, capsys):
    from keras_vit.cli import main

    _, _, files, tmp = budgeted
    plain = keras_vit.ViT(keras_vit.ViTConfig(4, 24, 40, 3, 1), image_size=16, num_classes=3)
    plain.save(tmp_path / "plain.keras")
    for argv, named in (([str(tmp_path / "plain.keras"), files[0], "--max-num-patches", "256"],
                         "--max-num-patches sizes the images of a NaFlex (SigLIP2) model"),
                        ([str(tmp / "hf"), files[0], "--max-num-patches", "256", "--image-size", "64"],
                         "--max-num-patches and --image-size both size the images: give one")):
        assert main(["predict", *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and named in lines[0], lines
    from keras_vit.model.naflex import patch_budget

    for wrong in (0, 2.5, "many", True):
        with pytest.raises(ValueError, match="max_num_patches is a count of patches.*or leave it out for the "
                                             "table's 64"):
            patch_budget(budgeted[1], wrong)


@pytest.mark.slow
def test_serving_bytes_takes_the_budget_and_the_report_records_it(budgeted, tmp_path):
    import tensorflow as tf

    from keras_vit.export import export
    from keras_vit.inspection.predict import predict_files

    _, model, files, _ = budgeted
    report = export(model, "saved_model", str(tmp_path), name="naflex", latency_runs=1, verbose=False,
                    max_num_patches=1024)
    assert report["passed"] and report["model"]["max_num_patches"] == 1024
    assert report["artifacts"][0]["notes"]["max_num_patches"] == 1024
    served = tf.saved_model.load(report["artifacts"][0]["path"]).signatures["serving_bytes"]
    probabilities = served(image_bytes=tf.constant([open(f, "rb").read() for f in files]))["probabilities"].numpy()
    predictions, _ = predict_files(model, files, top_k=3, max_num_patches=1024)
    for prediction, row in zip(predictions, probabilities):
        np.testing.assert_allclose(row[prediction.indices], prediction.probabilities, atol=1e-6, rtol=0)
