"""`predict` and the two CLIs on a saved tiny model, with good, odd and corrupt files."""

import json

import keras
import numpy as np
import pytest
from PIL import Image

from keras_vit import ViT, ViTConfig
from keras_vit import inspection
from keras_vit.cli import main

TINY = ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2)
LABELS = [f"digit {i}" for i in range(10)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A training workdir: model.keras and results.json with the labels."""
    keras.utils.set_random_seed(0)
    model = ViT(TINY, image_size=28, num_classes=10, num_channels=1, include_preprocessing=True)
    model.head.kernel.assign(np.random.default_rng(0).normal(size=model.head.kernel.shape).astype("float32"))
    path = tmp_path_factory.mktemp("run")
    model.save(path / "model.keras")
    (path / "results.json").write_text(json.dumps({"accuracy": 0.1, "labels": LABELS}))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A folder with grayscale, RGB, RGBA and odd-sized images, a corrupt PNG and a text file."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (28, 28)).astype(np.uint8), "L").save(folder / "a_gray.png")
    Image.fromarray(rng.integers(0, 256, (40, 30, 3)).astype(np.uint8), "RGB").save(folder / "b_rgb.jpg")
    Image.fromarray(rng.integers(0, 256, (28, 28, 4)).astype(np.uint8), "RGBA").save(folder / "c_rgba.png")
    Image.fromarray(rng.integers(0, 256, (100, 80)).astype(np.uint8), "L").save(folder / "d_big.png")
    good = (folder / "a_gray.png").read_bytes()
    (folder / "e_corrupt.png").write_bytes(good[:60])  # a truncated PNG
    (folder / "f_notes.txt").write_text("not an image")  # no image extension: ignored in a folder
    return folder


def test_predict_files_skips_and_names_a_corrupt_file(workdir, images):
    model = inspection.load_model(workdir)  # a workdir is enough
    labels = inspection.find_labels(workdir)
    assert labels == LABELS
    missing = str(images / "missing.png")
    predictions, failures = inspection.predict_files(model, [images, missing], top_k=3, labels=labels,
                                                     batch_size=2)
    assert [p.path.split("/")[-1] for p in predictions] == ["a_gray.png", "b_rgb.jpg", "c_rgba.png", "d_big.png"]
    assert {path for path, _ in failures} == {str(images / "e_corrupt.png"), missing}
    assert dict(failures)[missing] == "no such file"
    for p in predictions:
        assert len(p.labels) == 3 and p.labels == [LABELS[i] for i in p.indices]
        assert p.probabilities == sorted(p.probabilities, reverse=True)
        assert 0 < sum(p.probabilities) <= 1 + 1e-6
    # The same numbers as running the model on the decoded pixels directly.
    pixels, read, _ = inspection.load_images([images / "a_gray.png", images / "d_big.png"], (28, 28), 1)
    x = inspection.model_inputs(model, pixels)
    assert x.max() > 1.5  # include_preprocessing: the model is fed 0..255
    logits = np.asarray(model(x))
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    for prediction, row in zip([predictions[0], predictions[3]], expected):
        np.testing.assert_allclose(prediction.probabilities, np.sort(row)[::-1][:3], rtol=1e-4)


def test_load_image_converts_to_the_models_channels_and_size(images):
    gray = inspection.load_image(images / "b_rgb.jpg", (28, 28), 1)
    rgb = inspection.load_image(images / "a_gray.png", (32, 32), 3)
    assert gray.shape == (28, 28, 1) and rgb.shape == (32, 32, 3)
    np.testing.assert_array_equal(rgb[..., 0], rgb[..., 2])  # gray replicated
    with pytest.raises(OSError):
        inspection.load_image(images / "e_corrupt.png", (28, 28), 1)


def test_cli_predict_prints_top_k_and_reports_bad_files(workdir, images, capsys):
    code = main(["predict", str(workdir / "model.keras"), str(images / "a_gray.png"),
                 str(images / "e_corrupt.png"), str(images / "f_notes.txt"), "--top", "2"])
    out, err = capsys.readouterr()
    assert code == 1  # some inputs failed: a script must not miss it (#37)
    lines = out.splitlines()
    assert lines[0].endswith("a_gray.png") and len(lines) == 3
    assert all(line.split("  ")[-1].strip() in LABELS for line in lines[1:])
    assert "e_corrupt.png" in err and "f_notes.txt" in err  # named on stderr, not a crash
    assert err.splitlines()[-1] == "keras-vit predict: 2 of 3 inputs failed (named above); the others were predicted."


def test_cli_predict_json_labels_file_and_progress(workdir, images, tmp_path, capsys):
    labels_file = tmp_path / "names.txt"
    labels_file.write_text("\n".join(f"class-{i}" for i in range(10)))
    code = main(["predict", str(workdir), str(images), "--json", "--labels", str(labels_file),
                 "--batch-size", "2", "--top", "1"])
    out, err = capsys.readouterr()
    assert code == 1  # e_corrupt.png failed
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 4 and all(r["labels"][0].startswith("class-") for r in rows)
    assert "predict" in err and "img" in err  # tqdm bar: 5 files in batches of 2
    assert "e_corrupt.png" in err and "1 of 5 inputs failed" in err


def test_cli_predict_fails_when_nothing_is_readable(workdir, images, capsys):
    assert main(["predict", str(workdir), str(images / "e_corrupt.png"), "--no-progress"]) == 2  # bad input
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("keras-vit predict: error: no image could be read: ") and "e_corrupt.png" in line


@pytest.mark.slow
def test_cli_inspect_writes_the_figures(workdir, images, tmp_path, capsys):
    out_dir = tmp_path / "figures"
    code = main(["inspect", str(workdir), "--image", str(images), "--image", str(images / "a_gray.png"),
                 "--out", str(out_dir), "--overlays", "2", "--dpi", "50"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "e_corrupt.png" in err
    assert "5 image(s)" in out
    for name in ("rollout", "attention_heads", "embedding_filters", "position_similarity", "attention_distance"):
        with Image.open(out_dir / f"{name}.png") as image:
            assert image.format == "PNG"
    with Image.open(out_dir / "rollout.png") as image:
        assert image.size == (250, 250)  # 5 x (2.5 * 2) inches at 50 dpi
