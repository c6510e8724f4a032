"""Shared fixtures: tiny architectures that build in milliseconds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every run in the suite, and in the processes it starts, in float32 whatever the CPU: `--precision
# auto` would train in bfloat16 on a CPU with AMX or AVX512-BF16 and in float32 elsewhere. The tests
# of auto's choice take the variable away (tests/test_precision.py).
os.environ["KERAS_VIT_PRECISION"] = "float32"

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


# --- SavedModel and HF artifacts validated by long-lived runners (#36; tests/runners.py) ---------------

@pytest.fixture(scope="session", autouse=True)
def _long_lived_runners():
    from keras_vit.export import validate
    from tests import runners

    original = validate.start_runner
    validate.start_runner, stop = runners.serve(original)
    yield
    validate.start_runner = original
    stop()


# --- one finished run on the bundled digits, built once (#36) ---------------------------------------------

def _shared_root(tmp_path_factory):
    """The folder every xdist worker of this session sees (the session's basetemp); this
    process's own basetemp without xdist (its parent is shared by other pytest sessions)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    """A finished 2-step `keras-vit train` run (tests/test_cli.py's TRAIN: Nano/4 on 7x7 patches of
    the bundled digits, no XLA; its checkpoint at step 2), trained once per `make test` however
    many workers and files ask for it: the first builds it under a lock, the others wait for it.

    Shared: read it only. A test that trains, resumes or re-runs on it (even one refused: it
    takes the workdir's lock) works on a copy (`copy_run`)."""
    import fcntl

    from keras_vit.cli import main
    from tests.test_cli import TRAIN

    root = _shared_root(tmp_path_factory)
    workdir, done = root / "digits_run" / "run", root / "digits_run" / "built"
    with open(root / "digits_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            import shutil

            shutil.rmtree(workdir.parent, ignore_errors=True)  # a build that failed half-way
            workdir.parent.mkdir()
            assert main([*TRAIN, "--steps", "2", "--checkpoint-every", "2", "--workdir", str(workdir)]) == 0
            done.write_text("")
    return workdir


def copy_run(run, tmp_path, name="run"):
    """A copy of the shared run folder `run` to write into."""
    import shutil

    return shutil.copytree(run, tmp_path / name)


# --- the order files are handed to the xdist workers (#36) --------------------------------------------------

# The longest files first (per-file totals of `make test`, longest first; docs/development.md): with
# `--dist loadfile --no-loadscope-reorder` (the Makefile), xdist hands files to the two workers in
# collection order, so the long ones start early and the short ones fill the gaps at the end. xdist's
# own order (most tests first) handed a 270 s file of 9 tests out among the last, and one worker then
# ran alone for ~130 s (now ~20 s; the run's wall time did not change measurably: the heavy files
# overlap each other instead). Files not named keep their place after these; a file's tests keep
# their order.
LONGEST_FIRST = (
    "test_recipe_matrix.py", "test_training_distributed.py", "test_cli.py", "test_task_fields.py", "test_experiments.py",
    "test_families_model.py", "test_family_cli.py", "test_packaging.py", "test_cli_sources.py",
    "test_export_artifacts.py", "test_training_loop.py", "test_backends.py", "test_docs_commands.py",
    "test_variants.py", "test_docs_python.py", "test_same_pixels_cli.py", "test_bench.py",
    "test_non_square_cli.py", "test_training_messy_folder.py", "test_export_sigmoid.py", "test_dynamic_size.py",
    "test_export_dynamic.py", "test_masked_patch.py", "test_gpu_benchmark.py",
)


# A renamed file would silently fall to the back.
assert all(os.path.exists(os.path.join(os.path.dirname(__file__), name)) for name in LONGEST_FIRST), LONGEST_FIRST


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
