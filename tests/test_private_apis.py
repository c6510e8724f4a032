"""Guards of the private or undocumented APIs keras-vit still uses (the list
and the reasons: docs/architecture.md, "Private APIs still used"). Each test
fails with a message naming the API and the code that relies on it, so that
a Keras, TensorFlow or LiteRT upgrade that moves one stops here, not in a
silently wrong training run or export."""

import numpy as np
import pytest
import tensorflow as tf

import keras
from keras_vit.training import optimization, steps
from keras_vit.training.config import TrainConfig

DOCS = "see docs/architecture.md, 'Private APIs still used'"


def _optimizers():
    """Every kind of optimizer the trainer builds: the three update rules,
    with layer-wise rates, and under loss scaling."""
    recipes = [dict(optimizer="sgd", momentum=0.9), dict(optimizer="adam"), dict(optimizer="adamw", weight_decay=0.1),
               dict(optimizer="adamw", weight_decay=0.1, layer_decay=0.75)]
    built = [optimization.make_optimizer(TrainConfig.create("scratch", **fields).recipe) for fields in recipes]
    loss_scaled = optimization.make_optimizer(TrainConfig.create("scratch").recipe, "mixed_float16")
    return built + [loss_scaled]


@pytest.mark.parametrize("optimizer", _optimizers(), ids=lambda o: type(o).__name__)
def test_every_trainer_optimizer_has_the_all_reduce_hook(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    assert hasattr(inner, "_all_reduce_sum_gradients"), (
        f"Keras' TF optimizer ({type(inner).__name__}) no longer has _all_reduce_sum_gradients: "
        f"keras_vit.training.steps._reduce_once cannot stop it from summing the replicas' gradients a "
        f"second time; look for Keras' new switch or hook ({DOCS}).")
    steps._reduce_once(optimizer)  # raises RuntimeError itself when the hook is gone


def _gradient_all_reduces(monkeypatch, reduce_once):
    """How many all-reduces one `optimizer.apply` makes in a replica context
    (a mirrored strategy of one device: the same code path as several)."""
    calls = []
    original = tf.distribute.ReplicaContext.all_reduce

    def counting(self, reduce_op, value, options=None):
        calls.append(reduce_op)
        return original(self, reduce_op, value, options)

    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce", counting)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variable = keras.Variable(np.ones(3, np.float32))
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build([variable])
    if reduce_once:
        steps._reduce_once(optimizer)
    strategy.run(tf.function(lambda: optimizer.apply([tf.ones(3)], [variable])))
    return len(calls)


def test_the_all_reduce_hook_is_where_keras_sums_the_gradients(monkeypatch):
    assert _gradient_all_reduces(monkeypatch, reduce_once=False) == 1, (
        "Keras' TF optimizer.apply no longer all-reduces the gradients once in a replica context: "
        f"re-check keras_vit.training.steps._reduce_once and its reason ({DOCS}).")
    assert _gradient_all_reduces(monkeypatch, reduce_once=True) == 0, (
        "keras_vit.training.steps._reduce_once no longer stops Keras' TF optimizer from all-reducing the "
        "gradients (Keras sums them somewhere other than _all_reduce_sum_gradients now): the trainer would "
        f"multiply its gradients by the number of replicas ({DOCS}).")


def test_litert_ships_the_tflite_schema_classes_the_metadata_code_uses():
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError as error:
        pytest.fail(f"ai_edge_litert.schema_py_generated is gone ({error}): keras_vit.export.tflite reads and "
                    f"writes the labels metadata and the op names with it; find where LiteRT ships the "
                    f"TFLite schema's Python classes now ({DOCS}).")
    missing = [name for name in ("ModelT", "BufferT", "MetadataT", "OperatorCodeT", "BuiltinOperator")
               if not hasattr(schema, name)]
    missing += [f"ModelT.{m}" for m in ("InitFromPackedBuf", "Pack") if not hasattr(getattr(schema, "ModelT", None), m)]
    assert not missing, (f"ai_edge_litert.schema_py_generated lacks {missing}, which keras_vit.export.tflite "
                         f"uses for the labels metadata and the op names ({DOCS}).")
    assert {"FULLY_CONNECTED", "CUSTOM", "DELEGATE"} <= set(vars(schema.BuiltinOperator)), (
        f"ai_edge_litert.schema_py_generated.BuiltinOperator changed its names ({DOCS}).")


def test_tf2onnx_still_reads_its_catch_errors_switch():
    """keras_vit.export.onnx_model sets TF2ONNX_CATCH_ERRORS during a conversion so that
    tf2onnx's optimisers run in place (no copy of the graph before each pass)."""
    import inspect

    tf2onnx = pytest.importorskip("tf2onnx")
    from tf2onnx import constants, convert

    name = getattr(constants, "ENV_TF2ONNX_CATCH_ERRORS", None)
    assert name == "TF2ONNX_CATCH_ERRORS", (
        f"tf2onnx {tf2onnx.__version__} no longer names its TF2ONNX_CATCH_ERRORS switch: "
        f"keras_vit.export.onnx_model._optimizer_errors_raised sets it ({DOCS}).")
    assert "ENV_TF2ONNX_CATCH_ERRORS" in inspect.getsource(convert), (
        f"tf2onnx {tf2onnx.__version__}'s conversion no longer reads TF2ONNX_CATCH_ERRORS: every ONNX export "
        f"copies the graph before each optimiser again (slower, same model); see "
        f"keras_vit.export.onnx_model._optimizer_errors_raised ({DOCS}).")
