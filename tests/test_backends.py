"""The model library on every Keras 3 backend: the same checkpoint gives the
same logits under TensorFlow, JAX and PyTorch, and .keras files move between
them. Each other backend runs in its own process (the backend is chosen at
import time)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from tests.conftest import tiny_config, tiny_hybrid_config
from tests.official_format import official_params, write_npz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    # name: (config, checkpoint grid, model image size, classes)
    "token": (tiny_config(representation_size=16), (4, 4), 16, 5),
    "gap_resized": (tiny_config(classifier="gap"), (4, 4), 24, 3),  # resized 4x4 -> 6x6 on load
    "hybrid": (tiny_hybrid_config(), (4, 4), 32, 4),
}


@pytest.fixture(scope="module")
def tensorflow_side(tmp_path_factory):
    assert keras.backend.backend() == "tensorflow"
    tmp = tmp_path_factory.mktemp("backends")
    rng = np.random.default_rng(0)
    images, cases, expected = {}, [], {}
    for name, (config, grid, size, classes) in CASES.items():
        params = official_params(config, grid, classes, representation_size=config.representation_size, rng=rng)
        npz = write_npz(tmp / f"{name}.npz", params)
        model = keras_vit.ViT(config, image_size=size, num_classes=classes, weights=npz)
        images[name] = rng.uniform(-1, 1, size=(3, size, size, 3)).astype("float32")
        expected[name] = np.asarray(model(images[name]))
        model.save(tmp / f"{name}_tf.keras")
        cases.append(dict(name=name, config=config.to_dict(), image_size=size, num_classes=classes, npz=npz,
                          keras_from_tf=str(tmp / f"{name}_tf.keras"), keras_out=str(tmp / f"{name}_other.keras")))
    np.savez(tmp / "images.npz", **images)
    return tmp, cases, images, expected


def run_backend(backend, tensorflow_side):
    tmp, cases, _, _ = tensorflow_side
    cases = [dict(c, keras_out=c["keras_out"].replace("_other", f"_{backend}")) for c in cases]
    job = dict(images=str(tmp / "images.npz"), cases=cases, out=str(tmp / f"{backend}.json"))
    (tmp / f"{backend}_job.json").write_text(json.dumps(job))
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "backend_worker.py"),
                           str(tmp / f"{backend}_job.json")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / f"{backend}.json").read_text()), cases


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_same_logits_and_portable_keras_files(backend, tensorflow_side):
    _, _, images, expected = tensorflow_side
    results, cases = run_backend(backend, tensorflow_side)
    assert results["backend"] == backend
    for case in cases:
        name = case["name"]
        assert np.abs(expected[name]).max() > 0.1  # real outputs, not a zero head
        # The same official checkpoint (position embedding resized for "gap_resized").
        np.testing.assert_allclose(results[name + "/npz"], expected[name], atol=1e-5, rtol=0, err_msg=name)
        # A .keras file saved under TensorFlow, loaded under this backend.
        np.testing.assert_allclose(results[name + "/keras_from_tf"], expected[name], atol=1e-5, rtol=0,
                                   err_msg=name)
        # ...and one saved under this backend, loaded under TensorFlow.
        restored = keras.models.load_model(case["keras_out"])
        np.testing.assert_allclose(np.asarray(restored(images[name])), expected[name], atol=1e-5, rtol=0,
                                   err_msg=name)
        assert results[name + "/count"] == restored.count_params()
    # model.fit fine-tunes on this backend.
    losses = results["fit_loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses
    for module in ("keras_vit.training", "keras_vit.export"):
        assert f"needs the TensorFlow backend of Keras, but KERAS_BACKEND is '{backend}'" in results[module]
        assert "KERAS_BACKEND=tensorflow" in results[module]
