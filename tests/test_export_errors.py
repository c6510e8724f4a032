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
    with pytest.raises(ExportError, match="saved_model: .*decodes images to 1, 3 or 4 channels.*takes 2"):
        export(two_channels, "saved_model", str(tmp_path), verbose=False)
    features = keras_vit.ViT(keras_vit.ViTConfig(**TINY), image_size=8, include_top=False, num_channels=1)
    with pytest.raises(ExportError, match="include_top=False"):
        export(features, "tflite", str(tmp_path), verbose=False)


def test_int8_needs_calibration_data(tiny_model, tmp_path):
    with pytest.raises(ExportError, match="representative sample of your data"):
        export(tiny_model, "tflite-int8", str(tmp_path), verbose=False)


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
