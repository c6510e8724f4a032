"""Issue #16, defect 2, at the command line: the same pictures saved as 8-bit
and as 16-bit PNGs give the same predictions in every path: training on a
`folder:` dataset, `keras-vit predict`, `keras-vit inspect` and export
validation (16-bit samples were saturated by Pillow's convert("L"))."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from keras_vit.cli import main
from tests import image_files

# Markers (setup.cfg): multi-process / long end-to-end runs stay out of `make test-fast`.
pytestmark = [pytest.mark.slow]

TRAIN = ["--model", "Nano/4", "--patch-size", "4", "--image-size", "16", "--recipe", "scratch", "--steps", "3",
         "--batch-size", "8", "--warmup-steps", "0", "--train-augment", "none", "--strategy", "default",
         "--no-jit", "--no-progress", "--deterministic", "--checkpoint-every", "100", "--seed", "3"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two copies of one dataset (2 classes x 10 pictures, grey and colour): 8-bit and 16-bit PNGs."""
    root = tmp_path_factory.mktemp("same")
    for c, name in enumerate(["dark", "light"]):
        for i in range(10):
            rgb = image_files.picture(16, 16, seed=10 * c + i)
            rgb = (rgb // 2 + 128 * c).astype(np.uint8)
            if i % 2:  # grey pictures
                gray = np.asarray(Image.fromarray(rgb).convert("L"))
                eight, sixteen = image_files.encoded(gray, "PNG"), image_files.png16_gray(gray)
            else:
                eight, sixteen = image_files.encoded(rgb, "PNG"), image_files.png16_rgb(rgb)
            for bits, content in (("8", eight), ("16", sixteen)):
                os.makedirs(root / bits / name, exist_ok=True)
                (root / bits / name / f"{i}.png").write_bytes(content)
    assert Image.open(root / "16" / "dark" / "1.png").mode.startswith("I")
    return root


@pytest.fixture(scope="module")
def trained(folders):
    """Both runs, with --deterministic: TensorFlow's op determinism stays on for this file's tests and
    is turned off again when they are done (no public API does; the rest of the worker's files run as
    they would without this one)."""
    from tensorflow.python.framework import config as tf_config

    was_deterministic = tf_config.is_op_determinism_enabled()
    runs = {}
    try:
        for bits in ("8", "16"):
            workdir = folders / f"run{bits}"
            assert main(["train", "--dataset", f"folder:{folders / bits}", "--workdir", str(workdir), *TRAIN]) == 0
            runs[bits] = workdir
        assert tf_config.is_op_determinism_enabled()  # what --deterministic asked for
        yield runs
    finally:
        if not was_deterministic:
            tf_config.disable_op_determinism()


def test_training_on_the_8_and_16_bit_folders_is_identical(trained):
    import keras

    results = {bits: json.loads((workdir / "results.json").read_text()) for bits, workdir in trained.items()}
    assert results["8"]["eval"]["loss"] == results["16"]["eval"]["loss"]
    weights = {bits: keras.models.load_model(workdir / "model.keras", compile=False).get_weights()
               for bits, workdir in trained.items()}
    for a, b in zip(weights["8"], weights["16"]):
        np.testing.assert_array_equal(a, b)


def test_predict_gives_the_same_answers(trained, folders, capsys):
    model = str(trained["8"] / "model.keras")
    outputs = {}
    for bits in ("8", "16"):
        assert main(["predict", model, str(folders / bits / "dark"), str(folders / bits / "light"),
                     "--json", "--no-progress", "--top", "2"]) == 0
        outputs[bits] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(outputs["8"]) == 20
    for a, b in zip(outputs["8"], outputs["16"]):
        assert a["probabilities"] == b["probabilities"] and a["labels"] == b["labels"]


def test_inspect_draws_the_same_figures(trained, folders, tmp_path, capsys):
    model = str(trained["8"] / "model.keras")
    for bits in ("8", "16"):
        assert main(["inspect", model, "--image", str(folders / bits / "dark" / "1.png"),
                     "--image", str(folders / bits / "light" / "2.png"), "--out", str(tmp_path / bits)]) == 0
    figures = sorted(os.listdir(tmp_path / "8"))
    assert figures and figures == sorted(os.listdir(tmp_path / "16"))
    for name in figures:
        assert (tmp_path / "8" / name).read_bytes() == (tmp_path / "16" / name).read_bytes(), name


def test_export_validation_sees_the_same_pixels(trained, folders, tmp_path):
    from keras_vit.export import data as data_lib

    np.testing.assert_array_equal(data_lib.load(str(folders / "8"), (16, 16), 3).images,
                                  data_lib.load(str(folders / "16"), (16, 16), 3).images)
    reports = {}
    for bits in ("8", "16"):
        main(["export", str(trained["8"]), "--formats", "tflite", "--out", str(tmp_path / bits),
              "--data", str(folders / bits), "--latency-runs", "1", "--quiet"])
        reports[bits] = json.loads((tmp_path / bits / "report.json").read_text())
    assert reports["8"]["keras"]["accuracy"] == reports["16"]["keras"]["accuracy"]
    for key in ("accuracy", "top1_agreement", "max_abs_diff"):
        assert reports["8"]["artifacts"][0][key] == reports["16"]["artifacts"][0][key], key
