"""ViT(dynamic_image_size=True): one model at any size equals a model built at
that size whose weights were resized at load (the official loader's rule), for
every position-embedding kind that resizes, token and GAP, and the hybrid; the
interpolation is skipped at the trained size."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.errors import UserError
from keras_vit.layers.interpolation import resize_along, resize_along_ops
from keras_vit.weights.npz import load_checkpoint, variables_by_key
from tests.conftest import tiny_config, tiny_hybrid_config

TRAINED = (16, 16)
SIZES = [(16, 16), (24, 24), (12, 20), (32, 8)]  # the trained size, larger, non-square both ways


def perturbed(model, rng):
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.2 for w in model.get_weights()])
    return model


def graph_call(model):
    """The model as a graph taking any spatial size: the run-time-grid path (the conditional), as exported."""
    spec = tf.TensorSpec((None, None, None, model.num_channels), tf.float32)
    return tf.function(lambda x: model(x, training=False), input_signature=[spec])


def reference_at(dynamic, config, size, **kwargs):
    """A model built at `size`, given the dynamic model's weights through the loader (resized at load)."""
    fixed = keras_vit.ViT(config, image_size=size, num_classes=3, **kwargs)
    load_checkpoint(fixed, {key: np.asarray(v) for key, v in variables_by_key(dynamic).items()})
    return fixed


# make test-fast: the 1-D table, which resizes, read by the class token (#36: 1.2-4 s a case).
@pytest.mark.parametrize("kind, classifier", [
    (kind, classifier) if (kind, classifier) == ("learned_1d", "token") else pytest.param(
        kind, classifier, marks=pytest.mark.slow)
    for classifier in ("token", "gap") for kind in ("learned_1d", "learned_2d", "sincos_2d", "none")])
def test_dynamic_model_equals_a_model_built_at_each_size(rng, kind, classifier):
    config = tiny_config(position_embedding=kind, classifier=classifier)
    dynamic = perturbed(keras_vit.ViT(config, image_size=TRAINED, num_classes=3, dynamic_image_size=True), rng)
    in_graph = graph_call(dynamic)
    for size in SIZES:
        x = rng.uniform(-1, 1, (2, *size, 3)).astype("float32")
        want = reference_at(dynamic, config, size)(x).numpy()
        np.testing.assert_allclose(dynamic(x).numpy(), want, atol=2e-5)  # static grid: resized in Python
        np.testing.assert_allclose(in_graph(x).numpy(), want, atol=2e-5)  # run-time grid: the conditional


@pytest.mark.slow
def test_hybrid_dynamic_equals_built_at_size(rng):
    config = tiny_hybrid_config()  # stride 8
    dynamic = perturbed(keras_vit.ViT(config, image_size=TRAINED, num_classes=3, dynamic_image_size=True), rng)
    in_graph = graph_call(dynamic)
    for size in [(16, 16), (24, 40)]:
        x = rng.uniform(-1, 1, (1, *size, 3)).astype("float32")
        want = reference_at(dynamic, config, size)(x).numpy()
        np.testing.assert_allclose(in_graph(x).numpy(), want, atol=5e-5)


def test_padding_equals_a_padded_image(rng):
    config = tiny_config()
    padded = perturbed(keras_vit.ViT(config, image_size=TRAINED, num_classes=3, dynamic_image_size=True,
                                     dynamic_image_pad=True), rng)
    plain = keras_vit.ViT(config, image_size=TRAINED, num_classes=3, dynamic_image_size=True)
    plain.set_weights(padded.get_weights())
    x = rng.uniform(-1, 1, (2, 13, 18, 3)).astype("float32")
    by_hand = np.pad(x, ((0, 0), (0, 3), (0, 2), (0, 0)))  # to 16 x 20, zeros bottom and right
    np.testing.assert_allclose(graph_call(padded)(x).numpy(), plain(by_hand).numpy(), atol=2e-5)


def test_in_graph_resize_is_the_load_time_resize(rng):
    table = rng.normal(size=(5, 7, 3)).astype("float32")
    for new in (1, 2, 5, 9, 16):
        got = keras.ops.convert_to_numpy(resize_along_ops(table, tf.constant(new), 1))
        np.testing.assert_allclose(got, resize_along(table.astype(np.float64), new, 1), atol=1e-6)


def test_trained_size_runs_no_interpolation():
    model = keras_vit.ViT(tiny_config(), image_size=TRAINED, num_classes=3, dynamic_image_size=True)
    graph = graph_call(model).get_concrete_function().graph
    branches = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(branches) == 1  # the interpolation sits in one branch, taken only off the trained grid
    true_fn = branches[0].get_attr("then_branch").name
    fn = graph._get_function(true_fn).graph
    assert not [op for op in fn.get_operations() if op.type in ("GatherV2", "Floor")]


def test_config_round_trip_and_errors(rng):
    model = keras_vit.ViT(tiny_config(), image_size=TRAINED, num_classes=3, dynamic_image_size=True,
                          dynamic_image_pad=True)
    again = keras_vit.ViT.from_config(model.get_config())
    assert again.dynamic_image_size and again.dynamic_image_pad and again.input_shape == (None, None, None, 3)
    assert "(B, H, W, 3), H and W any size (trained at 16x16)" in model.input_description
    plain = keras_vit.ViT(tiny_config(), image_size=TRAINED, num_classes=3, dynamic_image_size=True)
    with pytest.raises(UserError, match=r"multiples of 4, got \(13, 16\).*dynamic_image_pad=True"):
        plain(np.zeros((1, 13, 16, 3), "float32"))
    with pytest.raises(UserError, match="also pass dynamic_image_size=True"):
        keras_vit.ViT(tiny_config(), image_size=TRAINED, dynamic_image_pad=True)
    with pytest.raises(UserError, match="relative position bias"):
        keras_vit.ViT(tiny_config(position_embedding="relative"), image_size=TRAINED, dynamic_image_size=True)


BACKEND_SCRIPT = """
import numpy as np, keras, keras_vit
from tests.conftest import tiny_config
from keras_vit.weights.npz import checkpoint_params, load_checkpoint
rng = np.random.default_rng(0)
for kind in ("learned_1d", "learned_2d", "sincos_2d"):
    config = tiny_config(position_embedding=kind)
    dynamic = keras_vit.ViT(config, image_size=16, num_classes=3, dynamic_image_size=True)
    dynamic.set_weights([rng.normal(size=w.shape).astype("float32") * 0.2 for w in dynamic.get_weights()])
    x = rng.uniform(-1, 1, (2, 12, 20, 3)).astype("float32")
    fixed = keras_vit.ViT(config, image_size=(12, 20), num_classes=3)
    load_checkpoint(fixed, checkpoint_params(dynamic))
    want = keras.ops.convert_to_numpy(fixed(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(dynamic(x)), want, atol=2e-5)
    np.testing.assert_allclose(dynamic.predict(x, verbose=0), want, atol=2e-5)  # compiled (jit on JAX)
print("OK")
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_dynamic_model_on_other_backends(backend):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=root, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", BACKEND_SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
