"""#23: a multi-label model (a head ending in sigmoid) serves its sigmoid
probabilities: no softmax on top in the SavedModel, TFLite or ONNX artifact,
and `keras-vit predict` agrees. The artifacts are read back by their own
runtimes and compared with the Keras model's raw outputs, not with the
exporter's own reference (which would share a wrong rule)."""

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.export import export
from keras_vit.inspection import predict as predict_lib
from tests.conftest import tiny_config
from tests.sources_helpers import perturb_keras

PIXELS = np.random.default_rng(3).uniform(0, 255, (6, 8, 8, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def multilabel():
    model = keras_vit.ViT(tiny_config(), image_size=8, num_classes=4, classifier_activation="sigmoid")
    perturb_keras(model, 5)
    expected = np.asarray(model.predict_on_batch(keras_vit.preprocess_input(PIXELS)), np.float32)
    # Several labels on at once, rows not summing to 1: what a softmax on top would destroy.
    assert not np.allclose(expected.sum(axis=1), 1.0, atol=0.05)
    return model, expected


def _tflite_outputs(path):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    (inp,), out = interpreter.get_input_details(), interpreter.get_output_details()[0]
    rows = []
    for image in PIXELS:
        interpreter.set_tensor(inp["index"], image[None])
        interpreter.invoke()
        rows.append(interpreter.get_tensor(out["index"])[0].copy())
    return np.stack(rows)


def _onnx_outputs(path):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: PIXELS})[0]


@pytest.mark.slow
def test_sigmoid_head_serves_sigmoid_probabilities(multilabel, tmp_path):
    model, expected = multilabel
    # hf: validated by transformers in a fresh process, against the same sigmoid reference.
    formats = (["saved_model", "tflite"] + (["onnx"] if _has("tf2onnx") else [])
               + (["hf"] if _has("transformers") and _has("torch") else []))
    report = export(model, formats, str(tmp_path), name="tags", validation_data=PIXELS, latency_runs=1,
                    verbose=False)
    assert report["passed"], report["artifacts"]
    assert [row["format"] for row in report["artifacts"]] == formats
    served = tf.saved_model.load(str(tmp_path / "tags" / "1")).signatures["serving_default"]
    by_format = {"saved_model": served(images=tf.constant(PIXELS))["probabilities"].numpy(),
                 "tflite": _tflite_outputs(tmp_path / "tags.tflite")}
    if "onnx" in formats:
        by_format["onnx"] = _onnx_outputs(tmp_path / "tags.onnx")
    for fmt, probabilities in by_format.items():
        np.testing.assert_allclose(probabilities, expected, atol=1e-5, err_msg=fmt)


def test_predict_and_the_model_agree_on_sigmoid(multilabel):
    model, expected = multilabel
    assert model.output_activation == "sigmoid" and model.returns_probabilities
    np.testing.assert_allclose(predict_lib.predict_probabilities(model, PIXELS), expected, atol=1e-6)


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None
