"""Every SavedModel the exporter writes stores each weight once (issue 53): Keras 3.15's
ExportArchive stores each twice (keras-team/keras#23553), a Keras Variable and the
tf.Variable inside it, which TF Serving then restores both of. keras_vit.export.archive
writes its own root instead; here the checkpoint's tensors are counted for a float,
int8, int4, LoRA-merged, dynamic-size and NaFlex model, the TFLite converter's source
and the feature maps' SavedModel, and the float and int8 SavedModels are loaded in a
fresh process: one copy restored, and the signatures answer as Keras."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.export import saved_model, serving
from keras_vit.export import tflite as tflite_lib
from tests.conftest import tiny_config

LABELS = ["cat", "dog", "eel"]
SIZE = 8  # 2 x 2 patches of 4: the smallest ViT that has every kind of weight
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the checkpoint's own entry: no weight


def stored(path):
    """{checkpoint key: bytes} of the weights the SavedModel `path` stores (shape by dtype)."""
    reader = tf.train.load_checkpoint(os.path.join(str(path), "variables", "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    return {key: int(np.prod(shape)) * dtypes[key].size
            for key, shape in reader.get_variable_to_shape_map().items() if not key.startswith(OBJECT_GRAPH)}


def weight_bytes(model):
    """The model's weights in bytes, each variable once."""
    return sum(v.numpy().nbytes for v in {id(v): v for v in model.weights}.values())


def assert_once(path, model):
    tensors = stored(path)
    assert sum(tensors.values()) == pytest.approx(weight_bytes(model), rel=0.02), (
        f"{path} stores {sum(tensors.values()):,} bytes of weights, the model has {weight_bytes(model):,}: "
        f"{sorted(tensors)[:4]}")
    assert len(tensors) == len({id(v) for v in model.weights})


def _perturbed(model):
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(size=w.shape).astype(w.dtype) * 0.2 for w in model.get_weights()])
    return model


def _build(kind):
    float_model = lambda **kw: _perturbed(keras_vit.ViT(tiny_config(**kw.pop("config", {})), image_size=SIZE,  # noqa: E731
                                                        num_classes=len(LABELS), name=kind, **kw))
    if kind in ("int8", "int4"):
        return keras_vit.quantize(float_model(), kind)
    if kind == "lora-merged":
        return keras_vit.merge_lora(float_model(config=dict(lora_rank=2)))
    if kind == "dynamic":
        return float_model(dynamic_image_size=True)
    if kind == "naflex":  # SigLIP2's: a learned table each image's grid resizes, antialiased
        return float_model(config=dict(position_interpolation="bilinear_antialias"), dynamic_image_size=True)
    return float_model()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{kind: (model, SavedModel path)}, each written once for the module."""
    out, cache = tmp_path_factory.mktemp("weights_once"), {}

    def write(kind):
        if kind not in cache:
            model = _build(kind)
            saved_model.write(model, LABELS, str(out / kind))
            cache[kind] = model, out / kind
        return cache[kind]
    return write


# ~2 s each, the bytes signature's trace most of it: int4, a merged LoRA model and a dynamic one (which
# NaFlex is, besides its bytes signature's own path) go with the slow tests.
SLOW_KINDS = ("int4", "lora-merged", "dynamic")


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=[pytest.mark.slow] if kind in SLOW_KINDS else [])
                                  for kind in ("float", "int8", "naflex", *SLOW_KINDS)])
def test_a_saved_model_stores_each_weight_once(written, kind):
    model, path = written(kind)
    if kind == "naflex":
        from keras_vit.model.naflex import is_naflex

        assert is_naflex(model)
    assert_once(path, model)


def test_the_tflite_source_stores_each_float_weight_once(written, tmp_path):
    from keras_vit.model.quantization import dequantized

    model, _ = written("int8")  # the converter reads its dequantised (float) twin
    tflite_lib.write_source(model, str(tmp_path / "source"))
    assert_once(tmp_path / "source", dequantized(model))


def test_the_feature_saved_model_stores_each_weight_once(tmp_path):
    from keras_vit.export.features import export_features

    model = _perturbed(keras_vit.ViT(tiny_config(), image_size=SIZE, include_top=False, include_preprocessing=True))
    report = export_features(model, str(tmp_path), indices=[0, 1], formats=("saved_model",))
    assert_once(report["saved_model"]["path"], keras_vit.feature_model(model, [0, 1]))


# In a fresh process, as TF Serving loads it: every tf.Variable the loaded object reaches, each once.
LOAD = """
import json, sys
import numpy as np, tensorflow as tf
pixels = np.load(sys.argv[1])
answers = {}
for path in sys.argv[2:]:
    loaded = tf.saved_model.load(path)
    restored = {id(v): v for v in tf.train.TrackableView(loaded).descendants() if isinstance(v, tf.Variable)}
    out = loaded.signatures["serving_default"](images=tf.constant(pixels))
    answers[path] = {"variables": len(restored), "bytes": sum(v.numpy().nbytes for v in restored.values()),
                     "probabilities": out["probabilities"].numpy().tolist(),
                     "labels": [[b.decode() for b in row] for row in out["top_k_labels"].numpy()],
                     "ids": out["top_k_ids"].numpy().tolist()}
print(json.dumps(answers))
"""


@pytest.mark.slow  # a fresh process (TensorFlow's import: ~5 s)
def test_a_fresh_process_restores_one_copy_and_serves_as_keras(written, tmp_path):
    models = {kind: written(kind) for kind in ("float", "int8")}
    pixels = np.random.default_rng(1).uniform(0, 255, (2, SIZE, SIZE, 3)).astype(np.float32)
    np.save(tmp_path / "pixels.npy", pixels)
    done = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "pixels.npy"),
                           *(str(path) for _, path in models.values())],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for kind, (model, path) in models.items():
        answer = answers[str(path)]
        assert answer["variables"] == len({id(v) for v in model.weights}), kind
        assert answer["bytes"] == pytest.approx(weight_bytes(model), rel=0.02), kind
        np.testing.assert_allclose(answer["probabilities"], serving.keras_probabilities(model, pixels), atol=1e-5,
                                   err_msg=kind)
        assert answer["labels"] == [[LABELS[i] for i in row] for row in answer["ids"]], kind
