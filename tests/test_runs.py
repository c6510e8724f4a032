"""keras_vit.runs: the one reader/writer of a run folder (labels, results, model files, atomic writes)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_vit import runs
from keras_vit.utils import storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A workdir as the trainer leaves it: model.keras and labels.txt."""
    import keras_vit

    folder = tmp_path_factory.mktemp("run")
    model = keras_vit.ViT(keras_vit.ViTConfig(**TINY), image_size=8, num_classes=3, num_channels=1)
    rng = np.random.default_rng(0)
    for v in model.weights:  # perturbed, so that a wrong load would show
        v.assign(rng.normal(size=v.shape).astype("float32") * 0.1)
    model.save(folder / runs.MODEL_FILE)
    runs.write_labels(folder, ["cat", "dog", "bird"], 3)
    return folder, model


def test_labels_one_reader_for_text_json_and_results(tmp_path):
    (tmp_path / "a.txt").write_text("cat\n  spaced name\n\ndog\n\n")
    assert runs.read_labels(tmp_path / "a.txt") == ["cat", "  spaced name", "", "dog"]  # index = class id
    (tmp_path / "b.json").write_text(json.dumps({"1": "dog", "0": "cat"}))
    assert runs.read_labels(tmp_path / "b.json") == ["cat", "dog"]
    (tmp_path / "c.json").write_text(json.dumps({"labels": ["x", "y"]}))
    assert runs.read_labels(tmp_path / "c.json") == ["x", "y"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.read_labels(tmp_path / "missing.txt")
    # A workdir: labels.txt first, else a list in results.json, else None.
    work = tmp_path / "work"
    work.mkdir()
    assert runs.find_labels(work) is None
    runs.write_results(work, {"class_names": ["p", "q"]})
    assert runs.find_labels(work) == ["p", "q"]
    runs.write_labels(work, None, 3)
    assert (work / "labels.txt").read_text() == "0\n1\n2\n"
    assert runs.find_labels(work / "model.keras") == ["0", "1", "2"]  # a model file finds its folder's
    with pytest.raises(ValueError, match="2 labels for a model with 3 classes"):
        runs.write_labels(work, ["a", "b"], 3)


def test_load_model_from_a_file_or_a_workdir(run_folder):
    folder, model = run_folder
    x = np.random.default_rng(1).uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    for path in (folder, folder / "model.keras", str(folder)):
        loaded = runs.load_model(path)
        np.testing.assert_allclose(loaded(x), model(x), rtol=1e-6, atol=1e-6)
    import keras_vit

    assert keras_vit.load_model is runs.load_model


def test_missing_and_corrupt_model_files_say_which(tmp_path):
    with pytest.raises(runs.ModelFileError, match="does not exist"):
        runs.load_model(tmp_path / "nope.keras")
    with pytest.raises(runs.ModelFileError, match="has no model.keras"):
        runs.load_model(tmp_path)
    (tmp_path / "bad.keras").write_bytes(b"not a zip at all")
    with pytest.raises(runs.ModelFileError, match="exists but cannot be read.*not a zip archive"):
        runs.load_model(tmp_path / "bad.keras")


def test_truncated_keras_file_is_reported_as_unreadable(run_folder, tmp_path):
    folder, _ = run_folder
    data = (folder / "model.keras").read_bytes()
    # A zip whose central directory survives but whose members are damaged.
    import zipfile

    with zipfile.ZipFile(folder / "model.keras") as good, zipfile.ZipFile(tmp_path / "t.keras", "w") as bad:
        for item in good.infolist():
            content = good.read(item.filename)
            bad.writestr(item, content[: len(content) // 3] if item.filename.endswith(".json") else content)
    assert len(data) > 0
    with pytest.raises(runs.ModelFileError, match="exists but cannot be read as a .keras model \\("):
        runs.load_model(tmp_path / "t.keras")


@pytest.mark.slow
def test_keras_load_model_after_a_plain_import_keras_vit(run_folder):
    """After `import keras_vit` (no hook: it registers its layers as it imports), keras.saving.load_model finds them."""
    folder, _ = run_folder
    path = str(folder / "model.keras")
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def start(script):
        return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    with_keras_vit = start("import sys, keras_vit\n"
                           "import keras\n"
                           f"m = keras.saving.load_model({path!r}, compile=False)\n"
                           "print(type(m).__module__ + '.' + type(m).__name__)\n")
    # Without keras_vit, Keras 3 does not import a third-party module recorded
    # in the file (only keras, keras_hub, keras_cv, keras_nlp): its error names
    # the class's registered name, and keras_vit.load_model is the fix (README).
    # Its own process, started beside the first (two TensorFlow imports at once, not one after the other).
    without = start(f"import keras\ntry:\n    keras.saving.load_model({path!r})\n"
                    "except Exception as error:\n    print(type(error).__name__, 'keras_vit>ViT' in str(error))\n")
    (out, err), (out_without, err_without) = with_keras_vit.communicate(timeout=120), without.communicate(timeout=120)
    assert with_keras_vit.returncode == 0, err[-2000:]
    assert out.strip() == "keras_vit.model.ViT"
    assert out_without.strip() == "TypeError True", out_without + err_without[-2000:]


def test_changed_settings_lists_what_differs():
    before = {"seed": 0, "recipe": {"steps": 10, "learning_rate": 0.1}, "progress": True, "resolved": {"a": 1}}
    after = {"seed": 0, "recipe": {"steps": 20, "learning_rate": 0.1}, "progress": False, "resolved": {"a": 2}}
    assert runs.changed_settings(before, after) == {"recipe.steps": [10, 20]}


# --- bugs shown as bugs, the user's mistakes as one line (#30) -----------------------------------------------

def _cli(argv, capsys):
    """(exit status, stderr) of `keras-vit ARGV` run in this process."""
    from keras_vit.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def assert_bug(code, err, fragment):
    """The command line's answer to a bug of ours: the traceback, then the line asking for a report, exit 1."""
    assert code == 1, err
    assert "Traceback (most recent call last):" in err and fragment in err, err
    assert err.strip().splitlines()[-1].endswith("This is a bug in keras_vit: please report it with the traceback "
                                                  "above."), err


def assert_user_error(code, err, command, fragment):
    """The command line's answer to the user's mistake: one line naming it, no traceback, exit 2."""
    assert code == 2, err
    assert "Traceback" not in err and "This is a bug" not in err, err
    assert f"keras-vit {command}: error: " in err and fragment in err, err


def _png(path):
    from PIL import Image

    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(path)
    return path


def test_a_bug_in_the_models_from_config_is_shown_as_a_bug(run_folder, tmp_path, monkeypatch, capsys):
    """A from_config that no longer takes what it saved (an upgrade gone wrong) is ours, not a bad file."""
    import keras_vit.model

    def from_config(cls, config):
        raise TypeError("ViT.__init__() got an unexpected keyword argument 'simulated_bug'")

    monkeypatch.setattr(keras_vit.model.ViT, "from_config", classmethod(from_config))
    folder, _ = run_folder
    code, err = _cli(["predict", folder / "model.keras", _png(tmp_path / "a.png")], capsys)
    assert_bug(code, err, "simulated_bug")
    assert "cannot be read" not in err and "Re-copy" not in err
    with pytest.raises(TypeError, match="simulated_bug"):
        runs.load_model(folder)


def _damage_member(good, bad, member):
    """Copies the .keras file `good` to `bad` with one byte of `member` flipped (its checksum then fails)."""
    import zipfile

    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as archive:
        info = archive.getinfo(member)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # 30: the local header
    data[start + info.compress_size // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    return bad


def test_damaged_and_foreign_model_files_are_one_line_and_exit_2(run_folder, tmp_path, capsys):
    import zipfile

    import keras

    folder, _ = run_folder
    image = _png(tmp_path / "a.png")
    (tmp_path / "not_zip.keras").write_bytes(b"not a zip at all")
    with zipfile.ZipFile(tmp_path / "no_config.keras", "w") as archive:
        archive.writestr("notes.txt", "a zip, but not a model")

    class Doubler(keras.layers.Layer):  # someone else's layer, registered nowhere
        def call(self, x):
            return x * 2

    foreign = keras.Sequential([keras.Input((2,)), Doubler()])
    foreign.save(tmp_path / "foreign.keras")
    cases = {
        tmp_path / "missing.keras": "does not exist",
        tmp_path / "not_zip.keras": "not a zip archive",
        _damage_member(folder / "model.keras", tmp_path / "flipped.keras", "model.weights.h5"):
            "its member model.weights.h5 is damaged",
        tmp_path / "no_config.keras": "has no config.json",
        tmp_path / "foreign.keras": "holds Doubler, defined outside Keras and keras_vit",
    }
    for path, fragment in cases.items():
        code, err = _cli(["predict", path, image], capsys)
        assert_user_error(code, err, "predict", fragment)
        with pytest.raises(runs.ModelFileError, match=fragment):
            runs.load_model(path)


def test_labels_that_are_not_class_names_are_user_errors(tmp_path):
    from keras_vit.errors import UserError

    for content, fragment in ((5, "got int"), ({"cat": "dog"}, "'cat' is not a class index"),
                              ({"labels": "cat"}, "got str")):
        (tmp_path / "l.json").write_text(json.dumps(content))
        with pytest.raises(UserError, match=r"Labels file .*l\.json' is not a JSON list of class names.*" + fragment):
            runs.read_labels(tmp_path / "l.json")
    runs.write_results(tmp_path, {"labels": {"first": "cat"}})
    with pytest.raises(UserError, match=r"'labels' in .*results\.json' is not a JSON list.*'first'"):
        runs.find_labels(tmp_path)


def test_read_json_answers_empty_only_for_a_missing_or_damaged_file(tmp_path, monkeypatch):
    assert runs.read_json(tmp_path / "none.json") == {}
    (tmp_path / "cut.json").write_bytes(b'{"status": "fini')
    assert runs.read_json(tmp_path / "cut.json") == {}
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    assert runs.read_json(tmp_path / "binary.json") == {}

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(storage, "read_bytes", unreadable)  # not "no results": the user must hear of it
    with pytest.raises(PermissionError):
        runs.read_json(tmp_path / "cut.json")
