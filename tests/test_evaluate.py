"""`keras-vit evaluate MODEL DATA` (#39: predict, inspect, evaluate and export read any run): its
accuracy is the trainer's own on the same 1,000 held-out digits, a folder's classes are matched to
the model's by name, and what it cannot measure is one line."""

import json

import numpy as np
import pytest
from PIL import Image

from keras_vit.cli import main
from keras_vit.export.data import mnist_digits


def _evaluate(capsys, *args):
    code = main(["evaluate", *map(str, args), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_the_accuracy_is_the_trainer_s_on_the_held_out_digits(digits_run, capsys):
    figures = _evaluate(capsys, digits_run, "mnist")
    trained = json.loads((digits_run / "results.json").read_text())["eval"]
    assert figures["images"] == trained["num_examples"] == 1000 and figures["classes"] == 10
    assert figures["top1"] == pytest.approx(trained["accuracy"], abs=1e-9)
    assert figures["top5"] == pytest.approx(trained["top5"], abs=1e-9)
    per_class = figures["per_class"]
    assert sum(c["images"] for c in per_class.values()) == 1000
    assert sum(c["images"] * c["top1"] for c in per_class.values()) == pytest.approx(1000 * figures["top1"])


def test_a_folder_s_classes_are_the_model_s_of_their_names(digits_run, tmp_path, capsys):
    """Two of the digits' classes as folders named for them: each class's accuracy is its own in the
    whole set's, not that of the classes at the folders' positions (0 and 1)."""
    whole = _evaluate(capsys, digits_run, "mnist")["per_class"]
    ranked = sorted(whole, key=lambda c: (-whole[c]["top1"], c))
    chosen = sorted([ranked[0], ranked[-1]])  # the best and the worst class: a mix-up shows
    assert [whole[c]["top1"] for c in chosen] != [whole[c]["top1"] for c in ("0", "1")]
    digits = mnist_digits(split="test")
    for name in chosen:
        (tmp_path / name).mkdir()
        for i in np.flatnonzero(digits.labels == int(name)):
            Image.fromarray(digits.images[i, ..., 0].astype(np.uint8)).save(tmp_path / name / f"{i}.png")
    figures = _evaluate(capsys, digits_run, tmp_path)
    assert figures["per_class"] == {name: whole[name] for name in chosen}


def test_what_cannot_be_measured_is_one_line(digits_run, tmp_path, capsys):
    (tmp_path / "cats" / "tabby").mkdir(parents=True)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "cats" / "tabby" / "0.png")
    np.save(tmp_path / "unlabelled.npy", np.zeros((2, 28, 28), np.uint8))
    np.savez(tmp_path / "labels.npz", images=np.zeros((2, 28, 28), np.uint8), labels=np.array([3, 12]))
    for data, message in ((tmp_path / "cats", "has classes the model does not know: tabby"),
                          (tmp_path / "unlabelled.npy", "has no labels"),
                          (tmp_path / "labels.npz", "has labels 3..12, and the model 10 classes")):
        assert main(["evaluate", str(digits_run), str(data)]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0], error
