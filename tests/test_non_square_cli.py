"""Non-square end to end through the command line: train at 21x35 (a 3x5 grid
of 7-pixel patches), predict there and at another size (dynamic and rebuilt,
the same answers), inspect figures at the model's size, export and validate."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from keras_vit.cli import main
from tests.image_files import picture
from tests.test_cli import TRAIN

pytestmark = [pytest.mark.slow]  # a training run, figures and an export: ~30 s


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonsquare")
    workdir = root / "run"
    assert main([*TRAIN, "--image-size", "21,35", "--steps", "2", "--workdir", str(workdir)]) == 0
    images = []
    for seed, size in enumerate([(40, 30), (25, 60)]):
        path = root / f"picture{seed}.png"
        Image.fromarray(picture(*size, seed=seed)).save(path)
        images.append(str(path))
    return workdir, images


def predictions(capsys, argv):
    assert main(["predict", *argv, "--json", "--top", "10"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_trained_non_square(run):
    import keras

    workdir, _ = run
    assert json.loads((workdir / "config.json").read_text())["recipe"]["image_size"] == [21, 35]
    assert keras.saving.load_model(workdir / "model.keras").input_shape == (None, 21, 35, 1)


def test_predict_at_its_size_and_another(run, capsys):
    workdir, images = run
    at_model = predictions(capsys, [str(workdir), *images])
    assert len(at_model) == 2
    dynamic = predictions(capsys, [str(workdir), *images, "--image-size", "35,21", "--dynamic-image-size"])
    rebuilt = predictions(capsys, [str(workdir), *images, "--image-size", "35,21"])
    for a, b in zip(dynamic, rebuilt):  # all 10 classes, by class (near-ties may swap places)
        by_class = [dict(zip(p["indices"], p["probabilities"])) for p in (a, b)]
        np.testing.assert_allclose([by_class[0][i] for i in range(10)], [by_class[1][i] for i in range(10)],
                                   atol=1e-5)


def test_inspect_figures_non_square(run, tmp_path):
    workdir, images = run
    out = tmp_path / "figures"
    assert main(["inspect", str(workdir), "--image", images[0], "--out", str(out), "--image-size", "14,28"]) == 0
    assert any(name.endswith(".png") for name in os.listdir(out))


def test_export_non_square_fixed_and_dynamic(run, tmp_path, capsys):
    workdir, _ = run
    common = ["--formats", "saved_model", "--data", "mnist", "--num-validation", "50", "--latency-runs", "1",
              "--quiet"]
    capsys.readouterr()
    assert main(["export", str(workdir), "--out", str(tmp_path / "fixed"), *common]) == 0
    printed = capsys.readouterr().out
    # --quiet (#30): the table alone, no progress lines.
    assert "[export]" not in printed and printed.splitlines()[-1].startswith("export passed"), printed
    report = json.loads((tmp_path / "fixed" / "report.json").read_text())
    assert report["model"]["input_shape"] == [21, 35, 1] and report["passed"]
    # Any size as TFLite (a SavedModel of a dynamic non-square model: tests/test_export_dynamic.py, at 16x24).
    dynamic = [*common[:1], "tflite", *common[2:]]
    assert main(["export", str(workdir), "--out", str(tmp_path / "any"), "--dynamic-image-size", *dynamic]) == 0
    report = json.loads((tmp_path / "any" / "report.json").read_text())
    assert report["model"]["dynamic_image_size"] and report["model"]["input_shape"] == [21, 35, 1]
    assert report["passed"] and [a["format"] for a in report["artifacts"]] == ["tflite"]
