"""Each family's transformers directory gives transformers' outputs under JAX and
PyTorch too (TensorFlow: tests/test_hf_families.py), at its own size and at
another one (resized at load and in a dynamic model). The other backends run in
their own processes (the backend is chosen at import time)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.test_hf_families import CASES, expected, images, saved

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One checkpoint per family, each with another size to resize to.
FAMILY_CASES = {"deit_teacher": 44, "dinov2_swiglu_classifier": 44, "dinov2_registers": 24,
                "siglip_vision": 40, "clip_vision_projection": (36, 44)}


@pytest.fixture(scope="module")
def transformers_side(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("family_backends")
    arrays, cases, want = {}, [], {}
    for name, size in FAMILY_CASES.items():
        hf, directory = saved(tmp, name, positions=5.0)
        arrays[name + "/native"] = images(CASES[name][3], seed=1)
        arrays[name + "/resized"] = images(size, seed=2)
        want[name + "/native"] = expected(hf, name, arrays[name + "/native"])
        want[name + "/resized"] = want[name + "/dynamic"] = expected(hf, name, arrays[name + "/resized"],
                                                                     interpolate=True)
        cases.append(dict(name=name, directory=str(directory), size=size if np.isscalar(size) else list(size)))
    np.savez(tmp / "images.npz", **arrays)
    return tmp, cases, want


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_family_checkpoints_match_transformers_on_every_backend(backend, transformers_side):
    tmp, cases, want = transformers_side
    job = dict(images=str(tmp / "images.npz"), cases=cases, out=str(tmp / f"{backend}.json"))
    (tmp / f"{backend}_job.json").write_text(json.dumps(job))
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "family_backend_worker.py"),
                           str(tmp / f"{backend}_job.json")], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp / f"{backend}.json").read_text())
    assert results["backend"] == backend
    for key, value in want.items():
        assert np.abs(value).max() > 0.3, key  # a real signal
        np.testing.assert_allclose(np.asarray(results[key]), value, atol=1e-4, rtol=0, err_msg=key)
