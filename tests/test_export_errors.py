"""Clear errors before any work: unknown format, missing model, unsuitable model or data."""

import os

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.export import ExportError, export, parse_formats
from keras_vit.export import cli as export_cli
from keras_vit.export import data as data_lib
from keras_vit.export import source as source_lib
from keras_vit.export import tflite

TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1)


@pytest.fixture(scope="module")
def tiny_model():
    return keras_vit.ViT(keras_vit.ViTConfig(**TINY), image_size=8, num_classes=3, num_channels=1)


def test_unknown_format(tiny_model, tmp_path):
    with pytest.raises(ExportError, match="Unknown export format.*'coreml'.*choose from saved_model"):
        export(tiny_model, "tflite,coreml", str(tmp_path), verbose=False)
    assert parse_formats("saved-model, tflite_int8") == ["saved_model", "tflite-int8"]
    assert not os.listdir(tmp_path)  # nothing written


def test_missing_model_file_and_workdir(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export(str(tmp_path / "nope.keras"), "tflite", str(tmp_path / "out"), verbose=False)
    with pytest.raises(ExportError, match="has no model.keras"):
        export(str(tmp_path), "tflite", str(tmp_path / "out"), verbose=False)
    with pytest.raises(ExportError, match="neither a model file, a workdir nor a variant"):
        export("no_such_thing", "tflite", str(tmp_path / "out"), verbose=False)
    assert not (tmp_path / "out").exists()


def test_input_the_format_cannot_take(tmp_path):
    two_channels = keras_vit.ViT(keras_vit.ViTConfig(**TINY), image_size=8, num_classes=3, num_channels=2)
    with pytest.raises(ExportError, match="saved_model: .*decodes images to 1 or 3 channels.*takes 2"):
        export(two_channels, "saved_model", str(tmp_path), verbose=False)
    features = keras_vit.ViT(keras_vit.ViTConfig(**TINY), image_size=8, include_top=False, num_channels=1)
    with pytest.raises(ExportError, match="include_top=False"):
        export(features, "tflite", str(tmp_path), verbose=False)


def test_int8_needs_calibration_data_named_in_the_callers_words(tiny_model, tmp_path, capsys):
    with pytest.raises(ExportError, match="representative sample of your data: pass validation_data= or "
                                          "calibration_data="):
        export(tiny_model, "tflite-int8", str(tmp_path), verbose=False)
    # The command line names its flag (#30: the README's command lacked it, the message named keywords).
    tiny_model.save(str(tmp_path / "tiny.keras"))
    from keras_vit.cli import main

    capsys.readouterr()
    assert main(["export", str(tmp_path / "tiny.keras"), "--formats", "tflite-int8", "--out",
                 str(tmp_path / "out")]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "pass --data FOLDER" in line and "calibration_data" not in line, line


def test_labels_must_match_the_classes(tiny_model, tmp_path):
    with pytest.raises(ExportError, match="2 labels for a model with 3 classes"):
        export(tiny_model, "tflite", str(tmp_path), labels=["a", "b"], verbose=False)


def test_workdir_labels_from_results_json(tiny_model, tmp_path):
    tiny_model.save(tmp_path / "model.keras")
    (tmp_path / "results.json").write_text('{"config": {}, "labels": ["cat", "dog", "bird"]}')
    source = source_lib.resolve(str(tmp_path))
    assert source.labels == ["cat", "dog", "bird"] and source.name == tmp_path.name
    (tmp_path / "results.json").unlink()
    assert source_lib.resolve(str(tmp_path)).labels == ["0", "1", "2"]


def test_flex_ops_are_refused(tmp_path):
    class WithErf(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec((1, 4), tf.float32)])
        def serve(self, x):
            return {"y": tf.math.erf(x)}  # no TFLite builtin: needs Flex

    module = WithErf()
    tf.saved_model.save(module, str(tmp_path / "erf"), signatures=module.serve)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "erf"))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    with pytest.raises(tflite.UnsupportedOpsError, match="FlexErf"):
        tflite.builtin_ops(converter.convert())


def test_mnist_digits_format():
    digits = data_lib.mnist_digits()
    assert digits.images.shape == (5000, 28, 28, 1) and digits.images.max() == 255
    assert np.bincount(digits.labels).tolist() == [500] * 10
    assert len(set(digits.labels[:20].tolist())) > 3  # shuffled (the file is sorted by class)
    rgb = data_lib.conform(digits.images[:2], (32, 32), 3)
    assert rgb.shape == (2, 32, 32, 3) and rgb.dtype == np.float32


def test_cli_reports_errors_with_exit_code_2(tmp_path, capsys):
    from keras_vit.cli import main

    assert main(["export", str(tmp_path / "missing.keras"), "--formats", "tflite", "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--formats", "pdf"]) == 2
    assert "Unknown export format" in capsys.readouterr().err


# --- bugs shown as bugs, the user's mistakes as one line (#30) ----------------------------------------------

def _export_cli(source, tmp_path, *extra):
    return ["export", str(source), "--formats", "saved_model", "--out", str(tmp_path / "out"), "--quiet", *extra]


def test_a_bug_while_resolving_the_source_is_shown_as_a_bug(tiny_model, tmp_path, monkeypatch, capsys):
    from tests.test_runs import _cli, assert_bug

    tiny_model.save(tmp_path / "model.keras")

    def check_model(model):
        raise ValueError("operands could not be broadcast together (simulated bug)")

    monkeypatch.setattr(source_lib, "_check_model", check_model)
    code, err = _cli(_export_cli(tmp_path / "model.keras", tmp_path), capsys)
    assert_bug(code, err, "simulated bug")
    with pytest.raises(ValueError, match="simulated bug") as raised:
        export(str(tmp_path / "model.keras"), "saved_model", str(tmp_path / "out"), verbose=False)
    assert not isinstance(raised.value, ExportError)
    assert not (tmp_path / "out").exists()


def test_a_bug_in_a_weights_loader_during_export_is_shown_as_a_bug(tmp_path, monkeypatch, capsys):
    from keras_vit.weights import npz
    from tests.test_runs import _cli, assert_bug

    model = keras_vit.ViT("Mu/4", image_size=28, num_classes=10, num_channels=1)
    weights = keras_vit.save_weights(model, str(tmp_path / "mu4.npz"))

    def load_checkpoint(model, params, old_grid=None):
        raise ValueError("cannot reshape array of size 48 into shape (4,4,1,16) (simulated bug)")

    monkeypatch.setattr(npz, "load_checkpoint", load_checkpoint)
    code, err = _cli(_export_cli("Mu/4", tmp_path, "--weights", weights, "--image-size", "28", "--num-classes", "10",
                                 "--num-channels", "1"), capsys)
    assert_bug(code, err, "simulated bug")


def test_a_bug_while_loading_the_data_is_shown_as_a_bug(tiny_model, tmp_path, monkeypatch, capsys):
    from tests.test_runs import _cli, assert_bug

    tiny_model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "data.npz", images=np.zeros((4, 8, 8, 1), np.uint8), labels=np.arange(4) % 3)

    def conform(images, image_size, num_channels):
        raise TypeError("'NoneType' object is not subscriptable (simulated bug)")

    monkeypatch.setattr(data_lib, "conform", conform)
    code, err = _cli(_export_cli(tmp_path / "model.keras", tmp_path, "--data", tmp_path / "data.npz"), capsys)
    assert_bug(code, err, "simulated bug")


def test_bad_sources_and_data_are_one_line_and_exit_2(tiny_model, tmp_path, capsys):
    from tests.test_runs import _cli, assert_user_error

    tiny_model.save(tmp_path / "model.keras")
    good = tmp_path / "data.npz"
    np.savez(good, images=np.zeros((4, 8, 8, 1), np.uint8), labels=np.arange(4) % 3)
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:300])
    (tmp_path / "text.npy").write_text("not an array")
    (tmp_path / "not_zip.keras").write_bytes(b"not a zip at all")
    model = tmp_path / "model.keras"
    cases = [
        (_export_cli(tmp_path / "missing.keras", tmp_path), "does not exist"),
        (_export_cli(tmp_path / "not_zip.keras", tmp_path), "not a zip archive"),
        (_export_cli("no_such_thing", tmp_path), "neither a model file, a workdir nor a variant"),
        (_export_cli(model, tmp_path, "--data", tmp_path / "none.npz"), "does not exist"),
        (_export_cli(model, tmp_path, "--data", tmp_path / "cut.npz"), "cut.npz' is not a readable .npz file"),
        (_export_cli(model, tmp_path, "--data", tmp_path / "text.npy"), "text.npy' is not a readable .npy file"),
        (_export_cli(model, tmp_path, "--labels", tmp_path / "none.txt"), "none.txt"),
    ]
    for argv, fragment in cases:
        code, err = _cli(argv, capsys)
        assert_user_error(code, err, "export", fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_bug_while_building_one_format_is_shown_as_a_bug(tiny_model, tmp_path, monkeypatch, capsys):
    """A failure raised inside keras_vit's own code while a format builds is a bug (its traceback);
    one raised inside a converter stays a failed row of the table (the other formats go on)."""
    from keras_vit.export import tflite as tflite_lib
    from tests.test_runs import _cli, assert_bug

    tiny_model.save(str(tmp_path / "tiny.keras"))
    argv = ["export", str(tmp_path / "tiny.keras"), "--formats", "tflite", "--out", str(tmp_path / "out"),
            "--latency-runs", "1", "--quiet"]
    # Our code reading labels from a buffer it was never given: an AttributeError in keras_vit.
    monkeypatch.setattr(tflite_lib, "with_labels", lambda content, labels: tflite_lib.read_labels(None))
    code, err = _cli(argv, capsys)
    assert_bug(code, err, "read_labels")
    assert not (tmp_path / "out").exists()

    def converter_fails(content, labels):  # as a converter deep in another package fails
        import json

        return json.loads("{not json")

    monkeypatch.setattr(tflite_lib, "with_labels", converter_fails)
    code, err = _cli(argv, capsys)
    assert code == 1 and "Traceback" not in err and "export failed for tflite" in err, err
    import json

    (row,) = [r for r in json.loads((tmp_path / "out" / "report.json").read_text())["artifacts"]
              if r["format"] == "tflite"]
    assert row["failures"][0].startswith("JSONDecodeError")
