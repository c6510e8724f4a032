"""The distribution as a user gets it (#23.3): the sdist and wheel built from
this checkout carry the package data, and the wheel installed WITHOUT extras
into a fresh venv (no system site packages) imports, runs a forward pass,
reads the bundled digits and answers `keras-vit --help`, `keras-vit
variants` and `keras-vit demo --help`.

Two venvs, the same smoke test in each:
- "newest": the wheel alone; pip picks the newest TensorFlow and Keras.
- "floor": the wheel with Keras pinned to the floor setup.cfg declares
  (read from the wheel's own Requires-Dist) and tensorflow 2.19.1, the newest
  TensorFlow that accepts that Keras (2.20 needs keras>=3.10, 2.21 >=3.12).
  The smoke test there also takes a gradient through a rematerialised block:
  keras.remat is the API that sets the floor.

Installs go through pip's cache (no --no-cache-dir), so a CI machine pays
the TensorFlow download once. Needs the package index (not the internet at
large) and ~1.5 GB of disk per venv while it runs.
"""

import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "keras_vit/data/mnist5k.npz"
FLOOR_TENSORFLOW = "tensorflow==2.19.1"
# What left the core (#23.2): the bare install must not bring any of it.
NOT_IN_CORE = ["mlxtend", "scipy", "matplotlib", "tensorflow_datasets", "huggingface_hub", "ai_edge_litert",
               "tf2onnx", "onnxruntime", "sklearn"]
# Not copied to the build folder: environments, caches and outputs of this checkout.
IGNORED = shutil.ignore_patterns(".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", "runs", "exports",
                                 "figures", ".pytest_cache", ".whl")


def _check(command, timeout, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """(sdist, wheel) built from a copy of this checkout (the build leaves
    its egg-info and build/ in the copy, not in the working tree); the wheel
    is built from the sdist, as `python -m build` does, so it proves the sdist whole."""
    work = tmp_path_factory.mktemp("build")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    _check([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(source)], timeout=600)
    (sdist,) = (work / "dist").glob("*.tar.gz")
    (wheel,) = (work / "dist").glob("*.whl")
    return sdist, wheel


def test_sdist_and_wheel_carry_the_digits_and_the_new_name(dists):
    sdist, wheel = dists
    assert sdist.name.startswith("keras_vision_transformer-") and wheel.name.startswith("keras_vision_transformer-")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(name.endswith("/" + DATA) for name in names)
    assert any(name.endswith("/keras_vit/data/README.md") for name in names)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
        assert archive.getinfo(DATA).file_size > 500_000
    assert "keras_vit/data/README.md" in names
    assert not any(name.startswith("tests/") for name in names)
    assert metadata["Name"] == "keras-vision-transformer"
    core = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert sorted(re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in core) == [
        "keras", "numpy", "pillow", "safetensors", "tensorflow", "tqdm"]
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"train", "tflite", "onnx", "hub", "plot", "all", "docs", "test"} <= extras


def _floor(wheel):
    """keras==X for the keras>=X the wheel declares."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = email.message_from_bytes(archive.read(name)).get_all("Requires-Dist")
    (keras,) = [r for r in requires if re.match(r"keras\s*>=", r)]
    return "keras==" + keras.split(">=")[1].split(",")[0].strip()


SMOKE = textwrap.dedent("""
    import importlib.util, os, sys
    import numpy as np
    import keras, tensorflow as tf
    import keras_vit
    from keras_vit.data import mnist5k
    from keras_vit.model import rematerialize_blocks

    assert keras_vit.__file__.startswith(sys.prefix), keras_vit.__file__  # the installed copy, not the checkout
    missing = [m for m in sys.argv[1].split(",") if importlib.util.find_spec(m) is not None]
    assert not missing, f"the core install brought {missing}"
    config = keras_vit.ViTConfig(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                                 dropout_rate=0.1, stochastic_depth_rate=0.1)  # random masks for remat to replay
    model = keras_vit.ViT(config, image_size=32, num_classes=3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    probs = np.asarray(model(x))
    assert probs.shape == (2, 3) and np.all(np.isfinite(probs))
    assert rematerialize_blocks(model) == 2
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None and np.all(np.isfinite(g)) for g in grads)
    images, labels = mnist5k.read()
    assert images.shape == (5000, 28, 28, 1) and images.dtype == np.uint8
    assert sorted(set(labels.tolist())) == list(range(10))
    print("smoke ok", keras.__version__, tf.__version__)
""")


@pytest.mark.parametrize("pins", ["newest", "floor"])
def test_the_wheel_without_extras_works_in_a_fresh_venv(dists, pins, tmp_path):
    _, wheel = dists
    venv = tmp_path / "venv"
    _check([sys.executable, "-m", "venv", str(venv)], timeout=300)
    bin_dir = venv / "bin"
    requirements = [str(wheel)] + ([_floor(wheel), FLOOR_TENSORFLOW] if pins == "floor" else [])
    _check([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", *requirements], timeout=1200)
    # Away from the checkout, so nothing of it is importable.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    run = dict(cwd=str(tmp_path), env=env, timeout=300)
    out = _check([str(bin_dir / "python"), "-c", SMOKE, ",".join(NOT_IN_CORE)], **run)
    assert "smoke ok" in out
    if pins == "floor":
        assert f"smoke ok {_floor(wheel).split('==')[1]} 2.19.1" in out
    _check([str(bin_dir / "python"), "-m", "pip", "check"], **run)
    cli = str(bin_dir / "keras-vit")
    assert "variants" in _check([cli, "--help"], **run)
    table = _check([cli, "variants"], **run)
    assert "B/16" in table and "Mu/4" in table
    assert "--workdir" in _check([cli, "demo", "--help"], **run)
