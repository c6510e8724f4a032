"""#30.1: keras_vit is a guest in the user's process.

`import keras_vit` before TensorFlow leaves the process as TensorFlow alone
would: the same environment variables (TensorFlow sets some itself), the same
import hooks in sys.meta_path, and TensorFlow's own start-up lines on stderr,
unchanged (on a machine without a GPU, "GPU will not be used" and the cuInit
error: the lines a user with a broken CUDA set-up needs). The command line
owns its process and stays quiet (tests/test_cli.py).
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r"""
import json, os, sys
before = dict(os.environ)
if sys.argv[1] == "keras_vit":
    import keras_vit  # noqa: F401
import tensorflow as tf
float(tf.constant(1.0) + 1.0)  # starts the devices: TensorFlow logs then too
changed = {k: os.environ.get(k) for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
hooks = [type(f).__module__ + "." + type(f).__qualname__ for f in sys.meta_path]
keras = sys.modules.get("keras")  # looked up, not imported: an import here could log and change stderr
registered = sorted(k for k in keras.saving.get_custom_objects() if k.startswith("keras_vit>")) if keras else []
print(json.dumps({"env": changed, "meta_path": hooks, "registered": registered}))
"""

# Timestamps and the process id differ from run to run.
_STAMP = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ")


def _probe(first_import):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a new shell has it
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, "-c", PROBE, first_import], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    state["stderr"] = [_STAMP.sub(r"\1 ", line) for line in done.stderr.splitlines()]
    return state


@pytest.fixture(scope="module")
def probes():
    """The two fresh processes, TensorFlow alone and keras_vit first: every test here reads them."""
    return _probe("nothing"), _probe("keras_vit")


@pytest.mark.slow
def test_importing_keras_vit_first_leaves_the_process_as_tensorflow_alone_would(probes):
    alone, guest = probes
    assert guest["env"] == alone["env"]
    assert guest["meta_path"] == alone["meta_path"]
    assert "keras_vit" not in " ".join(guest["meta_path"])
    assert guest["stderr"] == alone["stderr"]
    # On this machine TensorFlow says something at start-up; it reaches the user.
    assert any("TensorFlow" in line or "cuda" in line.lower() for line in guest["stderr"]), guest["stderr"]


@pytest.mark.slow
def test_keras_vit_registers_its_layers_with_keras_on_import(probes):
    # The guest process imported keras_vit (and with it Keras), then TensorFlow; nothing else of keras_vit.
    alone, guest = probes
    assert guest["registered"] and all(k.startswith("keras_vit>") for k in guest["registered"]), guest
    assert "keras_vit>ViT" in guest["registered"], guest["registered"]
    assert not alone["registered"]  # TensorFlow alone registers none of them
