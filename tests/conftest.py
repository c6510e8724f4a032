"""Shared fixtures: tiny architectures that build in milliseconds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

import keras_vit


def tiny_config(**overrides):
    base = dict(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2)
    base.update(overrides)
    return keras_vit.ViTConfig(**base)


def tiny_hybrid_config(**overrides):
    # Two stages of one unit: stride 8, widths 64 -> 128 (GroupNorm needs >= 32 channels).
    base = dict(patch_size=1, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                resnet=keras_vit.ResNetConfig(num_layers=(1, 1), width_factor=1))
    base.update(overrides)
    return keras_vit.ViTConfig(**base)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _log_python_processes(log):
    """Each Python process a test starts (the CLI, a validation runner, a worker), for
    the suite's start-up cost (docs/development.md): one line per start."""
    import sys

    def hook(event, args):
        if event == "subprocess.Popen" and args[0] and os.path.basename(str(args[0])).startswith("python"):
            with open(log, "a") as f:
                f.write(f"{os.getpid()} SPAWN {' '.join(map(str, list(args[1])[1:3]))[:120]!r}\n")

    sys.addaudithook(hook)


if os.environ.get("KERAS_VIT_TEST_RSS"):
    _log_python_processes(os.environ["KERAS_VIT_TEST_RSS"])


@pytest.fixture(autouse=True)
def _record_memory(request):
    """KERAS_VIT_TEST_RSS=FILE: each test's resident memory after it ran (to find
    the tests that grow a worker) and the Python processes it started."""
    yield
    log = os.environ.get("KERAS_VIT_TEST_RSS")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {_rss_mb():.0f} {request.node.nodeid}\n")

