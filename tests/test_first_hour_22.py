"""Issue #22, what a new user hits in the first hour: a model that says what it
takes (7), quiet TensorFlow, converters and help texts (9), a rollout figure
that shows the classes (10)."""

import os
import re
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from keras_vit import runs
from keras_vit.utils import console as _console
from keras_vit.cli import main
from keras_vit.images import model_inputs
from keras_vit.export import serving
from keras_vit.inspection import cli_inspect, figures, plots
from keras_vit.inspection.predict import predict_probabilities
from tests.conftest import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ["cat", "dog", "fox"]


def perturbed(model, seed=0):
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny RGB ViT with class names, saved as model.keras in a run folder (as training leaves it)."""
    keras.utils.set_random_seed(0)
    model = perturbed(keras_vit.ViT(tiny_config(), image_size=16, num_classes=3, labels=CLASSES, name="tiny"))
    workdir = tmp_path_factory.mktemp("run")
    model.save(workdir / runs.MODEL_FILE)
    return model, workdir


def fresh_env(**extra):
    """The environment of a new shell: no TF_CPP_MIN_LOG_LEVEL (the test session sets one)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(extra)
    return env


# --- 7. the model says what it takes ----------------------------------------------------------------------

def test_a_model_records_and_prints_what_it_takes_22_7(saved, tmp_path):
    """#22.7: input_range / takes_raw_pixels, in describe(), summary() and load_model's docstring."""
    model, workdir = saved
    loaded = keras_vit.load_model(workdir)
    assert (loaded.input_range, loaded.takes_raw_pixels) == ("[-1, 1]", False)
    expected = "inputs: images (B, 16, 16, 3) in [-1, 1] (keras_vit.preprocess_input(pixels 0..255))"
    assert expected in loaded.describe()
    lines = []
    loaded.summary(print_fn=lambda text, **kwargs: lines.append(text))
    assert lines[-1].strip() == expected[0].upper() + expected[1:]
    raw = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3, include_preprocessing=True)
    assert (raw.input_range, raw.takes_raw_pixels) == ("0..255", True)
    assert "pixels 0..255 (scaled to [-1, 1] inside)" in raw.describe()
    # The one rule every path reads: predict/inspect (model_inputs) and export (serving) ask the model.
    pixels = np.random.default_rng(1).integers(0, 256, (2, 16, 16, 3)).astype(np.float32)
    np.testing.assert_allclose(model_inputs(loaded, pixels), keras_vit.preprocess_input(pixels), atol=1e-6)
    np.testing.assert_array_equal(model_inputs(raw, pixels), pixels)
    assert serving.takes_raw_pixels(loaded) is False and serving.takes_raw_pixels(raw) is True
    for doc in (keras_vit.load_model.__doc__, runs.load_model.__doc__):
        assert "[-1, 1]" in doc and "keras_vit.preprocess_input(pixels)" in doc and "NOT pixels" in doc


def test_a_loaded_model_can_take_pixels_as_exports_do_22_7(saved):
    """#22.7: load_model(include_preprocessing=True) / with_preprocessing(): same weights, pixels 0..255 in."""
    model, workdir = saved
    pixels = np.random.default_rng(2).integers(0, 256, (3, 16, 16, 3)).astype(np.float32)
    reference = np.asarray(model(keras_vit.preprocess_input(pixels)))
    takes_pixels = keras_vit.load_model(workdir, include_preprocessing=True)
    assert takes_pixels.input_range == "0..255" and takes_pixels.labels == CLASSES
    np.testing.assert_allclose(np.asarray(takes_pixels(pixels)), reference, atol=1e-5)
    np.testing.assert_allclose(np.asarray(model.with_preprocessing()(pixels)), reference, atol=1e-5)
    assert takes_pixels.with_preprocessing(False).input_range == "[-1, 1]"
    assert model.with_preprocessing(False) is model
    # keras_vit's own predict helper takes pixels whatever the model takes, with one answer.
    np.testing.assert_allclose(predict_probabilities(model, pixels), predict_probabilities(takes_pixels, pixels),
                               atol=1e-5)


def test_pixels_into_a_model_that_takes_minus_one_to_one_raise_22_7(saved):
    """#22.7: 0..255 values fed eagerly to a [-1, 1] model raise one line naming preprocess_input."""
    model, workdir = saved
    loaded = keras_vit.load_model(workdir)
    pixels = np.random.default_rng(3).integers(0, 256, (2, 16, 16, 3)).astype(np.float32)
    calls = {
        "call": lambda x: loaded(x),
        "call_tf": lambda x: loaded(tf.constant(x)),
        "call_uint8": lambda x: loaded(x.astype(np.uint8)),
        "predict": lambda x: loaded.predict(x, verbose=0),
        "predict_on_batch": lambda x: loaded.predict_on_batch(x),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as raised:
            call(pixels)
        message = str(raised.value)
        assert "\n" not in message and "keras_vit.preprocess_input(pixels)" in message, name
        assert "takes images in [-1, 1]" in message and "with_preprocessing()" in message, name
    # What a [-1, 1] model should get passes: scaled pixels, signed noise, zeros, [0, 1] values.
    rng = np.random.default_rng(4)
    for fine in (keras_vit.preprocess_input(pixels), rng.normal(size=pixels.shape).astype(np.float32),
                 np.zeros_like(pixels), rng.uniform(0, 1, pixels.shape).astype(np.float32)):
        assert np.asarray(loaded(fine)).shape == (2, 3)
    # Traced calls (tf.function, Keras' compiled predict step) are not checked: no value to look at.
    assert tf.function(lambda x: loaded(x))(tf.constant(pixels)).shape == (2, 3)
    loaded.check_input_range = False
    assert np.asarray(loaded(pixels)).shape == (2, 3)


# --- 9. quiet TensorFlow, quiet converters, whole help texts ----------------------------------------------------

STARTUP_NOISE = re.compile(r"cuInit|I0000|W0000|E0000|absl::InitializeLog|oneDNN|cpu_feature_guard|cudart_stub")
EXPORT_NOISE = re.compile(r"fully_quantize|inference_type|tf\.lite\.Interpreter is deprecated|XNNPACK|"
                          r"Issue encountered when serializing|CollectionDef|UserWarning|warnings\.warn")


def test_converter_chatter_is_dropped_and_the_rest_kept_22_9(capfd, recwarn):
    """#22.9: what the converters write to fd 2 (past Python) and their Python warnings and logs."""
    import logging
    import warnings

    with _console.quiet_conversion():
        os.write(2, b"fully_quantize: 0, inference_type: 6, input_inference_type: FLOAT32\n")
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
        os.write(2, b"a real problem\n")
        warnings.warn("    Warning: tf.lite.Interpreter is deprecated and is scheduled for deletion", UserWarning)
        logging.getLogger("tensorflow").warning("Issue encountered when serializing table_initializer.")
        # As numpy's nanmean warns inside TensorFlow's quantisation debugger (#30: seen by a user's export).
        warnings.warn_explicit("Mean of empty slice", RuntimeWarning, "debugger.py", 382,
                               module="tensorflow.lite.tools.optimize.debugging.python.debugger")
        warnings.warn_explicit("a real overflow", RuntimeWarning, "mine.py", 1, module="mine")
    err = capfd.readouterr().err
    assert "a real problem" in err and not EXPORT_NOISE.search(err), err
    kept = [str(w.message) for w in recwarn]
    assert "Mean of empty slice" not in err + str(kept) and kept == ["a real overflow"], (err, kept)


@pytest.mark.slow
def test_export_prints_no_converter_chatter_and_warns_in_one_line_22_9(saved, tmp_path):
    """#22.9: a real `keras-vit export` (TFLite float and int8, ONNX) on a folder with a broken file."""
    model, workdir = saved
    data = tmp_path / "data"
    rng = np.random.default_rng(5)
    for name in CLASSES:
        (data / name).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)).save(data / name / f"{i}.png")
    (data / "cat" / "broken.png").write_bytes(b"not a png")
    done = subprocess.run(
        [sys.executable, "-m", "keras_vit_cli", "export", str(workdir), "--formats", "tflite,tflite-int8,onnx",
         "--data", str(data), "--num-calibration", "6", "--latency-runs", "1", "--out", str(tmp_path / "out")],
        cwd=ROOT, env=fresh_env(), capture_output=True, text=True, timeout=600)
    assert "tflite-int8" in done.stdout and "onnx" in done.stdout, done.stdout + done.stderr
    assert not EXPORT_NOISE.search(done.stderr) and not STARTUP_NOISE.search(done.stderr), done.stderr
    warning = [line for line in done.stderr.splitlines() if line.strip()]
    assert warning[0] == (f"keras-vit: warning: 1 unreadable image(s) under {data} left out: "
                          f"{data / 'cat' / 'broken.png'} (not an image (Pillow recognises no image format in it))")
    # Nothing else, unless an artifact failed its thresholds (then the one-line failure).
    assert len(warning) == 1 or (len(warning) == 2 and warning[1].startswith("keras-vit export: ")), done.stderr


def test_help_says_whole_sentences_and_every_augmentation_22_9(capsys):
    """#22.9: `keras-vit --help` is not cut mid-sentence; `train --help` lists affine."""
    from keras_vit.training.config import AUGMENTATIONS

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    description = " ".join(out.split("\n\n")[1].split())
    assert description.endswith(".") and description[0].isupper(), out
    assert description.startswith("The Vision Transformer for Keras 3")
    with pytest.raises(SystemExit) as done:  # argparse's own --help exits
        main(["train", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert " | ".join(AUGMENTATIONS) in out and "affine" in AUGMENTATIONS


def test_offline_download_error_names_the_flag_on_the_command_line_22_9(tmp_path, monkeypatch, capsys):
    """#22.9: the CLI says `--weights PATH`; Python keeps weights='PATH'."""
    with socket.socket() as closed:  # a port nothing listens on: the download fails as offline
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", f"http://127.0.0.1:{port}/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    code = main(["export", "Ti/16", "--weights", "augreg-imagenet21k", "--image-size", "32", "--num-classes", "3",
                 "--formats", "tflite", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "keras-vit export: error: Could not download the checkpoint" in err, err
    assert "--weights /path/to/" in err and "weights='" not in err, err
    assert _console.COMMAND_LINE is False  # main() leaves the flag as it found it
    with pytest.raises(ValueError, match=r"e\.g\. weights='/path/to/.*\.npz'\.$"):
        keras_vit.ViT_Ti16(image_size=32, num_classes=3, weights="augreg-imagenet21k")


# --- 10. the rollout figure shows the classes, named, at their own shape ----------------------------------------

def test_overlays_are_drawn_round_the_classes_22_10():
    """#22.10: four overlays of a class-sorted folder show four classes, not four images of the first."""
    classes = ["a"] * 5 + ["b"] * 5 + ["c"] * 2 + [None]
    assert figures.choose_overlays(len(classes), 4, classes) == [0, 5, 10, 1]
    assert figures.choose_overlays(len(classes), 20, classes) == [0, 5, 10, 1, 6, 11, 2, 7, 3, 8, 4, 9, 12]
    assert figures.choose_overlays(6, 4) == [0, 1, 2, 3]  # no classes known: the first ones
    assert figures.choose_overlays(2, 4, ["a", "a"]) == [0, 1]


@pytest.mark.slow
def test_inspect_rollout_spans_classes_with_file_and_true_class_at_their_aspect_22_10(saved, tmp_path, monkeypatch,
                                                                                    capsys):
    """#22.10: `keras-vit inspect --image FOLDER --recursive` on class sub-folders of non-square photos."""
    model, workdir = saved
    shapes = {"cat": (30, 60), "dog": (60, 30), "fox": (40, 40)}  # (height, width) of each class's photos
    rng = np.random.default_rng(6)
    for name, (height, width) in shapes.items():
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (height, width, 3)).astype(np.uint8)).save(
                tmp_path / "photos" / name / f"{name}_{i}.png")
    captured = {}
    original = plots.plot_rollout

    def capture(images, maps, path, **kwargs):
        captured.update(images=images, **kwargs)
        return original(images, maps, path, **kwargs)

    monkeypatch.setattr(plots, "plot_rollout", capture)
    assert main(["inspect", str(workdir), "--image", str(tmp_path / "photos"), "--recursive",
                 "--out", str(tmp_path / "figures")]) == 0
    out = capsys.readouterr().out
    assert "inputs: images (B, 16, 16, 3) in [-1, 1] (keras_vit.preprocess_input(pixels 0..255))" in out
    assert ("9 image(s) of 3 classes; rollout.png shows cat_0.png (cat), dog_0.png (dog), fox_0.png (fox), "
            "cat_1.png (cat)") in out
    assert captured["captions"] == ["cat_0.png\ntrue: cat", "dog_0.png\ntrue: dog", "fox_0.png\ntrue: fox",
                                    "cat_1.png\ntrue: cat"]
    assert all(title.startswith("pred: ") and title.split()[1] in CLASSES for title in captured["titles"])
    # Each photo as the file holds it, not squashed to the model's 16 x 16.
    assert [image.shape[:2] for image in captured["images"]] == [(30, 60), (60, 30), (40, 40), (30, 60)]
    with Image.open(tmp_path / "figures" / "rollout.png") as png:
        assert png.size == (500, 1000)


def test_true_classes_come_from_class_folders_or_label_named_folders_22_10(tmp_path):
    """#22.10: <folder>/<class>/file, or a file in a folder named after a label; else unknown."""
    (tmp_path / "val" / "dog").mkdir(parents=True)
    (tmp_path / "cat").mkdir()
    files = [str(tmp_path / "val" / "dog" / "1.png"), str(tmp_path / "val" / "2.png"), str(tmp_path / "cat" / "3.png"),
             str(tmp_path / "4.png")]
    given = [str(tmp_path / "val"), files[2], files[3]]
    assert cli_inspect.true_classes(files, given, labels=CLASSES) == ["dog", None, "cat", None]
    assert cli_inspect.true_classes(files, given) == ["dog", None, None, None]
