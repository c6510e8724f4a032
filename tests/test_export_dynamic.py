"""export(dynamic_image_size=True): the SavedModel's serving signature, the ONNX
model and the TFLite model take any height and width; each is validated by the
exporter (a fresh process, at the model's size) and here at other sizes, the
SavedModel in a fresh process, against the Keras model at those sizes."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.errors import UserError
from keras_vit.export import export, serving
from keras_vit.export import tflite as tflite_lib
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow]  # three conversions and fresh processes: ~25 s

SIZES = [(16, 24), (32, 20)]  # the trained (non-square) size and another


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    rng = np.random.default_rng(0)
    model = keras_vit.ViT(tiny_config(), image_size=SIZES[0], num_classes=3, name="tiny")
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.2 for w in model.get_weights()])
    out = tmp_path_factory.mktemp("dynamic") / "out"
    report = export(model, "saved_model,tflite,onnx", out, dynamic_image_size=True, latency_runs=1, verbose=False)
    dynamic = model.with_image_size(dynamic_image_size=True)
    pixels = {size: rng.uniform(0, 255, (2, *size, 3)).astype("float32") for size in SIZES}
    want = {size: serving.keras_probabilities(dynamic, x) for size, x in pixels.items()}
    return out, report, pixels, want


def test_every_artifact_passed_at_the_models_size(exported):
    _, report, _, _ = exported
    assert report["passed"] and report["model"]["dynamic_image_size"]
    assert report["model"]["input_shape"] == [16, 24, 3]


def test_saved_model_answers_at_two_sizes_in_a_fresh_process(exported, tmp_path):
    out, _, pixels, want = exported
    np.savez(tmp_path / "pixels.npz", **{f"{h}x{w}": x for (h, w), x in pixels.items()})
    script = (
        "import json, sys, numpy as np, tensorflow as tf\n"
        "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
        "print(serve.structured_input_signature[1]['images'].shape)\n"
        "data = np.load(sys.argv[2])\n"
        "print(json.dumps({k: serve(images=tf.constant(data[k]))['probabilities'].numpy().tolist() for k in data}))\n")
    done = subprocess.run([sys.executable, "-c", script, str(out / "tiny" / "1"), str(tmp_path / "pixels.npz")],
                          capture_output=True, text=True, check=True)
    signature, answers = done.stdout.strip().splitlines()[-2:]
    assert signature == "(None, None, None, 3)"
    answers = json.loads(answers)
    for (h, w), expected in want.items():
        np.testing.assert_allclose(answers[f"{h}x{w}"], expected, atol=1e-5)


def test_onnx_and_tflite_answer_at_another_size(exported):
    import onnxruntime

    out, _, pixels, want = exported
    session = onnxruntime.InferenceSession(str(out / "tiny.onnx"))
    assert session.get_inputs()[0].shape[1:3] != [16, 24]  # symbolic height and width
    content = (out / "tiny.tflite").read_bytes()
    for size, x in pixels.items():
        np.testing.assert_allclose(session.run(None, {"images": x})[0], want[size], atol=1e-5)
        np.testing.assert_allclose(tflite_lib.predict(content, x), want[size], atol=1e-5)


def test_only_a_vit_is_made_dynamic(tmp_path):
    inputs = keras.Input((8, 8, 3))
    other = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))
    with pytest.raises(UserError, match="rebuild a keras_vit ViT"):
        export(other, "saved_model", tmp_path / "x", dynamic_image_size=True, verbose=False)
