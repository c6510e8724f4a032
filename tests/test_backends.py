"""The model library on every Keras 3 backend: the same checkpoint gives the
same logits under TensorFlow, JAX and PyTorch, and .keras files move between
them; each family's transformers directory gives transformers' outputs under
JAX and PyTorch too (TensorFlow: tests/test_hf_families.py), at its own size
and at another one (resized at load and in a dynamic model). Each other
backend runs in one process of its own (the backend is chosen at import
time), which does both jobs (tests/backend_worker.py)."""

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
from tests.test_hf_families import ANY_SIZE as NAFLEX
from tests.test_hf_families import CASES as HF_CASES
from tests.test_hf_families import expected, images, saved
from tests.image_text_helpers import save_family
from tests.test_image_text import FAMILIES as IMAGE_TEXT_FAMILIES
from tests.test_image_text import reference as image_text_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    # name: (config, checkpoint grid, model image size, classes)
    "token": (tiny_config(representation_size=16), (4, 4), 16, 5),
    "gap_resized": (tiny_config(classifier="gap"), (4, 4), 24, 3),  # resized 4x4 -> 6x6 on load
    "hybrid": (tiny_hybrid_config(), (4, 4), 32, 4),
}
# One transformers checkpoint per family, each with another size to resize to.
FAMILY_CASES = {"deit_teacher": 44, "dinov2_swiglu_classifier": 44, "dinov2_registers": 24,
                "siglip_vision": 40, "clip_vision_projection": (36, 44), "metaclip_2": 40,
                "dinov3": (24, 40), "siglip2_vision": (16, 44), "aimv2": (24, 40)}


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


@pytest.fixture(scope="module")
def transformers_side(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("family_backends")
    arrays, cases, want = {}, [], {}
    for name, size in FAMILY_CASES.items():
        hf, directory = saved(tmp, name, positions=5.0)
        arrays[name + "/native"] = images(HF_CASES[name][3], seed=1)
        arrays[name + "/resized"] = images(size, seed=2)
        want[name + "/native"] = expected(hf, name, arrays[name + "/native"])
        want[name + "/resized"] = want[name + "/dynamic"] = expected(hf, name, arrays[name + "/resized"],
                                                                     interpolate=True)
        if name in NAFLEX:  # a batch padded over three grids, each image's own output
            shapes = ((32, 32), (16, 40), (44, 12))
            padded = [images(shape, count=1, seed=3 + i)[0] for i, shape in enumerate(shapes)]
            arrays[name + "/padded"], arrays[name + "/grids"] = keras_vit.pad_batch(padded, HF_CASES[name][4])
            want[name + "/padded"] = expected(hf, name, padded)
        cases.append(dict(name=name, directory=str(directory), size=size if np.isscalar(size) else list(size)))
    # Both towers of each image-text family: tokens, text and image features, logits, zero-shot.
    x = np.random.default_rng(0).normal(size=(3, 32, 32, 3)).astype(np.float32)
    arrays["image_text"] = x
    for i, family in enumerate(IMAGE_TEXT_FAMILIES):
        hf, tokenizer = save_family(family, tmp / f"image_text_{family}", seed=i)
        for key, value in image_text_reference(family, hf, tokenizer, x).items():
            want[f"image_text/{family}/{key}"] = value
        cases.append(dict(name="image_text", family=family, directory=str(tmp / f"image_text_{family}")))
    np.savez(tmp / "images.npz", **arrays)
    return tmp, cases, want


@pytest.fixture(scope="module")
def other_backends(tensorflow_side, transformers_side):
    """run(backend): the worker's results for both jobs, one process per backend (run once)."""
    done = {}

    def run(backend):
        if backend not in done:
            done[backend] = run_backend(backend, tensorflow_side, transformers_side)
        return done[backend]

    return run


def run_backend(backend, tensorflow_side, transformers_side):
    tmp, cases, _, _ = tensorflow_side
    cases = [dict(c, keras_out=c["keras_out"].replace("_other", f"_{backend}")) for c in cases]
    job = dict(images=str(tmp / "images.npz"), cases=cases, out=str(tmp / f"{backend}.json"))
    (tmp / f"{backend}_job.json").write_text(json.dumps(job))
    family_tmp, family_cases, _ = transformers_side
    family_job = dict(images=str(family_tmp / "images.npz"), cases=family_cases,
                      out=str(family_tmp / f"{backend}.json"))
    (family_tmp / f"{backend}_job.json").write_text(json.dumps(family_job))
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    # XLA's CPU code generation without LLVM's optimisation passes: JAX compiles each op of an
    # eager call for each new shape (~480 small programs here), and the passes cost 60% of that
    # time; the computation (XLA's HLO) is the same.
    env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "backend_worker.py"),
                           str(tmp / f"{backend}_job.json"), str(family_tmp / f"{backend}_job.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return (json.loads((tmp / f"{backend}.json").read_text()), cases,
            json.loads((family_tmp / f"{backend}.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_same_logits_and_portable_keras_files(backend, tensorflow_side, other_backends):
    _, _, images, expected = tensorflow_side
    results, cases, _ = other_backends(backend)
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


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_family_checkpoints_match_transformers_on_every_backend(backend, transformers_side, other_backends):
    _, _, want = transformers_side
    _, _, results = other_backends(backend)
    assert results["backend"] == backend
    for key, value in want.items():
        if key.endswith("/token_ids") or key.endswith("/token_mask"):  # token for token
            np.testing.assert_array_equal(np.asarray(results[key]), value, err_msg=key)
            continue
        assert np.abs(value).max() > (0.05 if key.startswith("image_text/") else 0.3), key  # a real signal
        np.testing.assert_allclose(np.asarray(results[key]), value, atol=1e-4, rtol=0, err_msg=key)
