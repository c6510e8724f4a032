"""Image-text models (SigLIP, SigLIP2, CLIP, MetaCLIP 2) against transformers: small random
checkpoints with perturbed weights and a tokenizer of each family's own class, saved by
transformers (tests/image_text_helpers.py), give transformers' token ids, text and image
features, logits and zero-shot probabilities. JAX and PyTorch: tests/test_backends.py."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import keras_vit
from keras_vit.errors import UserError
from tests.image_text_helpers import save_family
from tests.test_hf_families import naflex_inputs

FAMILIES = ("siglip", "siglip2", "clip", "metaclip_2")
TEXTS = ["A photo of a CAT!", "two  dogs   playing", " a close-up of a fish ", "Ünïcode café—naïve",
         "numbers 1 2 3, and: punctuation?!", "the quick brown fox jumps over the lazy dog and keeps running far "
         "away past everything it sees"]  # the last is longer than every tower's positions
LABELS = ["cat", "dog", "a red sofa"]
TEMPLATES = ["a photo of a {}.", "a blurry photo of the {}"]


def transformers_tokens(family, hf, tokenizer, texts):
    """What the family's processor hands the model: SigLIP's padded to the tower's length."""
    length = hf.config.text_config.max_position_embeddings
    padding = "max_length" if family.startswith("siglip") else True
    return tokenizer(texts, padding=padding, max_length=length, truncation=True, return_tensors="pt")


def transformers_pixels(family, x):
    if family == "siglip2":
        return naflex_inputs(list(x), 8)
    return {"pixel_values": torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))}


def reference(family, hf, tokenizer, x):
    """transformers' tokens, features, logits and zero-shot probabilities (with a prompt ensemble,
    computed here from its own text features)."""
    tokens = transformers_tokens(family, hf, tokenizer, TEXTS)
    with torch.no_grad():
        text = hf.get_text_features(**tokens).pooler_output.numpy()
        image = hf.get_image_features(**transformers_pixels(family, x)).pooler_output.numpy()
        logits = hf(**tokens, **transformers_pixels(family, x)).logits_per_image.numpy()
        prompts = transformers_tokens(family, hf, tokenizer, [t.format(label) for label in LABELS for t in TEMPLATES])
        prompted = hf.get_text_features(**prompts).pooler_output.numpy()
        scale, bias = hf.logit_scale.exp().item(), getattr(hf, "logit_bias", None)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    ensemble = unit(unit(prompted).reshape(len(LABELS), len(TEMPLATES), -1).mean(1))
    label_logits = unit(image) @ ensemble.T * scale + (0.0 if bias is None else bias.item())
    if family.startswith("siglip"):
        zero_shot = 1 / (1 + np.exp(-label_logits))
    else:
        zero_shot = np.exp(label_logits) / np.exp(label_logits).sum(1, keepdims=True)
    return dict(token_ids=tokens["input_ids"].numpy(), token_mask=tokens["attention_mask"].numpy(), text=text,
                image=image, logits=logits, zero_shot=zero_shot)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (folder, transformers' outputs, images), each family written once."""
    root = tmp_path_factory.mktemp("image_text")
    x = np.random.default_rng(0).normal(size=(3, 32, 32, 3)).astype(np.float32)
    out = {}
    for i, family in enumerate(FAMILIES):
        hf, tokenizer = save_family(family, root / family, seed=i)
        out[family] = (root / family, reference(family, hf, tokenizer, x), hf, tokenizer)
    return out, x


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_features_logits_and_zero_shot_equal_transformers(saved, family, capsys):
    families, x = saved
    directory, want, _, _ = families[family]
    model = keras_vit.from_pretrained(str(directory), task="image_text")
    tokens = model.tokenize(TEXTS)
    np.testing.assert_array_equal(tokens["token_ids"], want["token_ids"])
    np.testing.assert_array_equal(tokens["token_mask"], want["token_mask"])
    assert capsys.readouterr().err.count("longer than the text tower") == 1  # said once
    model.tokenize(TEXTS)
    assert "longer" not in capsys.readouterr().err
    for got, key in ((model.text_embeddings(TEXTS), "text"), (model.image_embeddings(x), "image"),
                     (model.logits(x, TEXTS), "logits"), (model.zero_shot(x, LABELS, TEMPLATES), "zero_shot")):
        assert np.abs(want[key]).max() > 0.05, key  # a real signal
        np.testing.assert_allclose(got, want[key], atol=1e-4, rtol=0, err_msg=key)
    assert model.loss_kind == ("sigmoid" if family.startswith("siglip") else "softmax")


def test_zero_shot_without_templates_reads_each_label_as_given(saved):
    families, x = saved
    directory, _, hf, tokenizer = families["clip"]
    model = keras_vit.from_pretrained(str(directory), task="image_text")
    with torch.no_grad():
        out = hf(**transformers_tokens("clip", hf, tokenizer, LABELS), **transformers_pixels("clip", x))
    want = torch.softmax(out.logits_per_image, dim=-1).numpy()
    probabilities = model.zero_shot(x, LABELS)
    np.testing.assert_allclose(probabilities, want, atol=1e-5)
    np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-5)


def test_siglip_files_that_leave_the_mask_out_give_an_unmasked_tower(saved, tmp_path):
    # SigLIP's hub files say model_input_names ["input_ids"]: transformers then hands the model no
    # padding mask, and every token (the pooled last one is padding) attends to the padding.
    families, _ = saved
    directory, _, hf, tokenizer = families["siglip"]
    config = directory / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps(dict(settings, model_input_names=["input_ids"])))
    try:
        model = keras_vit.from_pretrained(str(directory), task="image_text")
    finally:
        config.write_text(json.dumps(settings))
    ids = transformers_tokens("siglip", hf, tokenizer, TEXTS[:3])["input_ids"]
    with torch.no_grad():
        want = hf.get_text_features(input_ids=ids).pooler_output.numpy()
        masked = hf.get_text_features(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long()).pooler_output.numpy()
    assert not model.uses_token_mask
    assert np.abs(want - masked).max() > 1e-2  # the two readings differ: the test can tell them apart
    np.testing.assert_allclose(model.text_embeddings(TEXTS[:3]), want, atol=1e-4)


@pytest.mark.parametrize("change,match", [
    (lambda d: [(d / name).unlink() for name in ("tokenizer.json", "spiece.model") if (d / name).exists()],
     "no tokenizer files"),
    (lambda d: (d / "config.json").write_text(json.dumps(dict(json.loads((d / "config.json").read_text()),
                                                               model_type="clip_vision_model"))),
     "single tower"),
])
def test_bad_checkpoints_are_named_in_one_line(saved, tmp_path, change, match):
    import shutil

    families, _ = saved
    directory = tmp_path / "copy"
    shutil.copytree(families["clip"][0], directory)
    change(directory)
    with pytest.raises(UserError, match=match) as error:
        keras_vit.from_pretrained(str(directory), task="image_text")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("labels,templates,match", [
    ([], None, "needs labels"), (["cat", "dog", "cat"], None, "given twice"), (["cat", " "], None, "needs labels"),
    (["cat"], ["a photo"], "must hold the label"),
])
def test_bad_labels_and_templates_are_named(saved, labels, templates, match):
    families, x = saved
    model = keras_vit.from_pretrained(str(families["clip"][0]), task="image_text")
    with pytest.raises(UserError, match=match):
        model.zero_shot(x, labels, templates)


def test_zero_shot_command_prints_each_images_probabilities(saved, tmp_path):
    from PIL import Image

    families, _ = saved
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(1)
    for name, size in (("wide.png", (20, 50)), ("tall.jpg", (60, 30))):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(photos / name)
    (photos / "broken.png").write_bytes(b"not an image")
    for family in ("clip", "siglip2"):
        command = [sys.executable, "-m", "keras_vit_cli", "zero-shot", str(families[family][0]), str(photos),
                   "--labels", "cat,dog,a red sofa", "--template", "a photo of a {}.", "--top", "2", "--json"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, done.stderr  # one input failed, named on stderr
        assert "skipped" in done.stderr and "broken.png" in done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert [line["image"].rsplit("/", 1)[-1] for line in lines] == ["tall.jpg", "wide.png"]
        for line in lines:
            scores = list(line["scores"].values())
            assert len(scores) == 2 and scores == sorted(scores, reverse=True)
            assert all(0 < s < 1 for s in scores)
    done = subprocess.run([sys.executable, "-m", "keras_vit_cli", "zero-shot", str(families["clip"][0]),
                           str(photos), "--labels", "cat,cat"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "given twice" in done.stderr and "Traceback" not in done.stderr


def _photos(folder, rng):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name, size in (("a.png", (20, 50)), ("b.jpg", (60, 30)), ("c.png", (32, 32))):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / name)


def test_search_ranks_a_folder_by_cosine_and_keeps_its_embeddings(saved, tmp_path, capsys):
    from keras_vit import cli
    from keras_vit.model.image_text import normalized
    from keras_vit.model.processor import read_processor

    families, _ = saved
    directory = str(families["siglip"][0])
    photos = tmp_path / "photos"
    _photos(photos, np.random.default_rng(2))
    assert cli.main(["search", directory, str(photos), "--text", "a cat on a sofa", "--json"]) == 0
    out, err = capsys.readouterr()
    ranked = [json.loads(line) for line in out.splitlines()]
    assert "3 embedded now" in err
    # The scores are the cosines of the model's own embeddings, highest first.
    model = keras_vit.from_pretrained(directory, task="image_text")
    inputs, read, _ = read_processor(model).read([r["image"] for r in ranked])
    want = normalized(model.image_embeddings(inputs)) @ normalized(model.text_embeddings(["a cat on a sofa"]))[0]
    np.testing.assert_allclose([r["score"] for r in ranked], want, atol=1e-5)
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
    # A second query reads the cache; a changed file alone is embedded again.
    _photos(tmp_path / "other", np.random.default_rng(3))
    (tmp_path / "other" / "a.png").replace(photos / "a.png")
    assert cli.main(["search", directory, str(photos), "--text", "a rocket", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "1 embedded now" in err and len(out.splitlines()) == 3
    # Texts ranked for an image: the family's zero-shot probabilities.
    assert cli.main(["search", directory, "--image", str(photos / "c.png"), "--labels", "cat,dog", "--json"]) == 0
    texts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    inputs, _, _ = read_processor(model).read([str(photos / "c.png")])
    want = model.zero_shot(inputs, ["cat", "dog"])[0]
    assert {t["text"]: t["score"] for t in texts} == pytest.approx(dict(zip(["cat", "dog"], want)), abs=1e-5)


def test_evaluate_zero_shot_names_classes_by_their_folders(saved, tmp_path, capsys):
    from keras_vit import cli
    from keras_vit.model.processor import read_processor

    families, _ = saved
    directory = str(families["clip"][0])
    data = tmp_path / "data"
    for i, name in enumerate(("cat", "dog")):
        _photos(data / name, np.random.default_rng(10 + i))
    assert cli.main(["evaluate", directory, str(data), "--zero-shot", "--template", "a photo of a {}.",
                     "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    model = keras_vit.from_pretrained(directory, task="image_text")
    files = sorted(str(p) for p in data.glob("*/*"))
    inputs, read, _ = read_processor(model).read(files)
    predicted = model.zero_shot(inputs, ["cat", "dog"], ["a photo of a {}."]).argmax(1)
    truth = np.array([0 if "/cat/" in path else 1 for path in read])
    assert figures["images"] == 6 and figures["top1"] == pytest.approx(float((predicted == truth).mean()))
    assert set(figures["per_class"]) == {"cat", "dog"}


def test_exported_zero_shot_classifier_serves_the_models_probabilities(saved, tmp_path):
    import tensorflow as tf

    from keras_vit.export import tflite
    from keras_vit.export.image_text_export import export_image_text
    from keras_vit.model.processor import read_processor

    families, _ = saved
    directory = str(families["clip"][0])
    report = export_image_text(directory, LABELS, "saved_model,tflite", str(tmp_path / "out"),
                               templates=TEMPLATES, verbose=False)
    assert report["passed"] and [row["format"] for row in report["artifacts"]] == ["saved_model", "tflite"]
    assert (tmp_path / "out" / "labels.txt").read_text().split("\n")[:3] == LABELS
    model = keras_vit.from_pretrained(directory, task="image_text")
    # Encoded photos of other sizes and aspects, read as the CLI reads them (CLIP's centre crop).
    photos = tmp_path / "photos"
    _photos(photos, np.random.default_rng(4))
    files = sorted(str(p) for p in photos.iterdir())
    inputs, read, _ = read_processor(model).read(files)
    want = model.zero_shot(inputs, LABELS, TEMPLATES)
    loaded = tf.saved_model.load(str(tmp_path / "out" / "clip" / "1"))
    encoded = tf.constant([open(path, "rb").read() for path in read])
    got = loaded.signatures["serving_bytes"](image_bytes=encoded)["probabilities"].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    content = (tmp_path / "out" / "clip.tflite").read_bytes()
    assert tflite.read_labels(content) == LABELS
    # The text tower: token ids in, the model's text embeddings out.
    export_image_text(directory, None, None, str(tmp_path / "text"), tower="text", verbose=False)
    tokens = model.tokenize(TEXTS)
    text = tf.saved_model.load(str(tmp_path / "text" / "clip" / "1")).signatures["serving_default"]
    np.testing.assert_allclose(text(token_ids=tf.constant(tokens["token_ids"]),
                                    token_mask=tf.constant(tokens["token_mask"]))["embeddings"].numpy(),
                               model.text_embeddings(TEXTS), atol=1e-5)
    for labels, formats, tower, match in ((None, None, "image", "needs its labels"),
                                          (None, "tflite", "text", "exports as saved_model")):
        with pytest.raises(UserError, match=match):
            export_image_text(directory, labels, formats, str(tmp_path / "refused"), tower=tower, verbose=False)
    assert not (tmp_path / "refused").exists()


def test_export_command_routes_an_image_text_folder(saved, tmp_path, capsys):
    from keras_vit import cli

    families, _ = saved
    directory = str(families["siglip"][0])
    assert cli.main(["export", directory, "--labels", "cat,dog", "--out", str(tmp_path / "out")]) == 0
    assert "saved_model" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["image_text"] == "SigLIP" and report["labels"] == ["cat", "dog"] and report["passed"]
    assert cli.main(["export", directory, "--out", str(tmp_path / "none")]) == 2
    assert "needs its labels" in capsys.readouterr().err


@pytest.mark.parametrize("argv,match", [
    (["zero-shot", "M", "x.png"], "--labels a,b,c or --labels-file"),
    (["zero-shot", "M", "x.png", "--labels", "a", "--labels-file", "f"], "--labels a,b,c or --labels-file"),
    (["zero-shot", "M", "x.png", "--labels-file", "no-such-file.txt"], "no such file"),
    (["search", "M", "folder"], "give --text SENTENCE"),
    (["search", "M", "--text", "a cat"], "ranks a folder's images"),
    (["search", "M", "--text", "a", "--image", "x.png"], "give --text SENTENCE"),
    (["evaluate", "M", "mnist", "--template", "a {}"], "--template words the class names of --zero-shot"),
])
def test_command_mistakes_are_one_line_before_any_model_loads(argv, match, capsys):
    from keras_vit import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_labels_from_a_file_and_wrong_sources_named(saved, tmp_path, capsys):
    from keras_vit import cli

    families, x = saved
    directory = str(families["siglip2"][0])
    (tmp_path / "labels.txt").write_text("\ufeffcat\n\ndog\n")
    photo = tmp_path / "p.png"
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(photo)
    assert cli.main(["zero-shot", directory, str(photo), "--labels-file", str(tmp_path / "labels.txt")]) == 0
    out = capsys.readouterr().out
    assert "cat" in out and "dog" in out
    assert cli.main(["search", directory, str(tmp_path), "--text", "  "]) == 2
    assert "--text is empty" in capsys.readouterr().err
    assert cli.main(["search", directory, "--image", str(tmp_path / "none.png"), "--labels", "cat"]) == 2
    assert "cannot read --image" in capsys.readouterr().err
    assert cli.main(["evaluate", directory, str(tmp_path / "labels.txt"), "--zero-shot"]) == 2
    assert "names no classes" in capsys.readouterr().err
    for source, match in ((str(tmp_path), "not an HF transformers folder"), (directory, "has no classification head")):
        with pytest.raises(UserError, match=match):
            keras_vit.from_pretrained(source, task="image_text", **({"include_top": True} if source == directory
                                                                     else {}))
    with pytest.raises(UserError, match="task='image_text'"):
        keras_vit.from_pretrained(directory, task="captions")
    vit = tmp_path / "vit.keras"
    keras_vit.ViT(keras_vit.ViTConfig(patch_size=4, hidden_size=8, mlp_dim=8, num_heads=2, num_layers=1),
                  image_size=8, num_classes=2).save(vit)
    with pytest.raises(UserError, match="holds a ViT, not an image-text model"):
        keras_vit.from_pretrained(str(vit), task="image_text")


@pytest.mark.parametrize("change,match", [
    (dict(model_type="vit"), "not an image-text model"),
    (dict(model_type="siglip_text_model"), "single tower"),
])
def test_other_model_types_are_named(change, match):
    from keras_vit.weights.hf_text import read_text_half

    with pytest.raises(UserError, match=match):
        read_text_half(change, {}, "DIR")


def test_a_checkpoint_without_its_text_tower_or_scale_is_named(saved):
    from safetensors.numpy import load_file

    from keras_vit.weights.hf_text import read_text_half

    families, _ = saved
    directory = families["siglip"][0]
    hf = json.loads((directory / "config.json").read_text())
    tensors = load_file(str(directory / "model.safetensors"))
    with pytest.raises(UserError, match="no text tower"):
        read_text_half(hf, {k: v for k, v in tensors.items() if not k.startswith("text_model.")}, "DIR")
    with pytest.raises(UserError, match="no logit_bias"):
        read_text_half(hf, {k: v for k, v in tensors.items() if k != "logit_bias"}, "DIR")
    half = read_text_half(hf, tensors, "DIR")
    wrong = dict(half.params)
    wrong.pop(next(iter(wrong)))
    model = keras_vit.from_pretrained(str(directory), task="image_text")
    from keras_vit.weights.hf_text import load_text_params

    with pytest.raises(UserError, match="the text tower does not match"):
        load_text_params(model.text_tower, wrong, "DIR")


def test_a_damaged_embeddings_cache_is_rebuilt_with_a_warning(saved, tmp_path, capsys):
    from keras_vit import cli
    from keras_vit.model.image_index import CACHE_FOLDER

    families, _ = saved
    directory = str(families["clip"][0])
    photos = tmp_path / "photos"
    _photos(photos, np.random.default_rng(5))
    assert cli.main(["search", directory, str(photos), "--text", "a cat"]) == 0
    first = capsys.readouterr().out
    (cache,) = (photos / CACHE_FOLDER).iterdir()
    cache.write_bytes(b"not an npz")
    assert cli.main(["search", directory, str(photos), "--text", "a cat"]) == 0
    captured = capsys.readouterr()
    assert "cannot be read" in captured.err and "3 embedded now" in captured.err
    assert captured.out == first  # the same ranking, from the images again


def test_clip_processor_crops_the_centre_of_the_shorter_side(saved, tmp_path):
    from keras_vit.model.processor import ImageProcessor, read_processor

    families, _ = saved
    model = keras_vit.from_pretrained(str(families["clip"][0]), task="image_text")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"do_center_crop": True, "crop_size": 32, "size": {"shortest_edge": 32}}))
    model.directory = str(tmp_path)
    processor = read_processor(model)
    assert (processor.shortest_edge, processor.crop) == (32, (32, 32))
    # A wide image whose left and right thirds differ from its centre: only the centre is kept.
    wide = np.zeros((32, 96, 3), np.uint8)
    wide[:, 32:64] = 200
    pixels = processor.pixels(wide)
    assert pixels.shape == (32, 32, 3) and pixels.min() > 190
    plain = ImageProcessor(model.image_tower).pixels(wide)  # resized whole: the dark sides come along
    assert plain.min() < 10
