"""tf.distribute in fresh processes: mirrored on 2 logical CPUs, 2-process
multi-worker on localhost, and kill -9 + resume under op determinism."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.training_helpers import checkpoint_arrays

# Markers (setup.cfg): multi-process / long end-to-end runs stay out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240


def _launch(spec, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.training_worker", json.dumps(spec)], cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# Several runs, one after the other, in one fresh process: each import of
# TensorFlow costs a process ~10 s, so runs that need no process of their own
# (the uninterrupted references, the resumes of runs killed elsewhere) share one.
_MANY = "import json, sys\nfrom tests import training_worker\nfor spec in json.loads(sys.argv[1]):\n    training_worker.main(spec)"


def _launch_many(specs):
    process = subprocess.Popen(
        [sys.executable, "-c", _MANY, json.dumps(specs)], cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.runs = len(specs)  # runs one after another: each gets a single run's time limit
    return process


def _finish(process, expect_rc=0, every=False):
    """-> the last RESULT line's object (every: the list of all of them, in order)."""
    timeout = TIMEOUT * getattr(process, "runs", 1)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"worker timed out after {timeout}s\n{err[-3000:]}")
    assert process.returncode == expect_rc, f"rc {process.returncode}\n{out[-2000:]}\n{err[-5000:]}"
    results = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    if every:
        return results
    return results[-1] if results else None


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


# Issue #24: every augmentation and regulariser on at once (groups of 2 x 2
# examples mixed, so every per-replica batch below holds whole groups).
REGULARISED = {"randaugment": [2, 10], "mixup": 0.8, "cutmix": 1.0, "mix_prob": 0.9, "mix_switch_prob": 0.5,
               "random_erasing": 0.25, "repeated_augmentation": 2, "ema": 0.9, "layer_decay": 0.75,
               "loss": "sigmoid", "lr_base_batch": 8, "label_smoothing": 0.1, "train_augment": "translate"}


def test_mirrored_on_two_devices_equals_one_device(tmp_path):
    # XLA-compiled per-replica step, global batch 16 = 2 replicas x 8.
    result = _finish(_launch({"workdir": str(tmp_path), "logical_cpus": 2, "mirrored_vs_one_device": True,
                              "overrides": {"steps": 3, "batch_size": 16, "jit_compile": True}}))
    assert result["replicas"] == {"one_device": 1, "mirrored": 2}
    assert result["max_weight_difference"] < 1e-5 * max(1.0, result["max_weight"]), result
    np.testing.assert_allclose(result["losses"]["one_device"], result["losses"]["mirrored"], rtol=1e-5)
    assert abs(result["eval_loss"]["one_device"] - result["eval_loss"]["mirrored"]) < 1e-4


def test_a_mirrored_step_all_reduces_the_gradients_once(tmp_path):
    # Traced under two replicas: each replica's step carries the gradients
    # into exactly one all-reduce (Keras' optimizer would sum them again).
    result = _finish(_launch({"workdir": str(tmp_path), "logical_cpus": 2, "count_all_reduces": True,
                              "overrides": {"steps": 4, "batch_size": 16, "strategy": "mirrored",
                                            "jit_compile": True}}))
    assert result["replicas"] == 2 and result["steps"] == 2
    assert result["gradient_all_reduces"] == result["replicas"], result  # one per replica, per traced step


def test_mirrored_equals_one_device_with_every_augmentation_and_regulariser(tmp_path):
    result = _finish(_launch({"workdir": str(tmp_path), "logical_cpus": 2, "mirrored_vs_one_device": True,
                              "overrides": {"steps": 3, "batch_size": 16, "jit_compile": True, **REGULARISED}}))
    assert result["replicas"] == {"one_device": 1, "mirrored": 2}
    assert result["max_weight_difference"] < 1e-5 * max(1.0, result["max_weight"]), result
    np.testing.assert_allclose(result["losses"]["one_device"], result["losses"]["mirrored"], rtol=1e-5)


def _cluster(tmp_path, workdir, overrides, tag, kill_at=None, **spec):
    """Launches a 2-worker cluster on localhost; kill_at: worker 1 kills itself after that step."""
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        worker_spec = {"workdir": str(workdir), "weights_out": str(tmp_path / f"{tag}{index}.npz"),
                       "overrides": {"strategy": "multi_worker", **overrides}, **spec}
        if kill_at and index == 1:
            worker_spec["kill_at"] = kill_at
        workers.append(_launch(worker_spec, env={"TF_CONFIG": tf_config}))
    return workers


# One epoch of the 4,000 training digits at global batch 32: 125 steps.
CLUSTER = {"steps": 125, "batch_size": 32, "learning_rate": 1e-2, "checkpoint_every": 25, "deterministic": True,
           "steps_per_loop": 5}


def test_two_worker_cluster_on_localhost_trains_agrees_and_resumes_a_killed_worker(tmp_path):
    results = [_finish(w) for w in _cluster(tmp_path, tmp_path / "run", CLUSTER, "straight", count_writes=True,
                                            record_images=True)]
    assert [r["replicas"] for r in results] == [2, 2]
    assert results[0]["losses"] == results[1]["losses"]  # the all-reduced loss
    assert np.mean(results[0]["losses"][-5:]) < np.mean(results[0]["losses"][:5]) - 0.1, results[0]["losses"]
    assert results[0]["eval"] == results[1]["eval"]  # each evaluates its shard; the sums are all-reduced
    assert results[0]["eval"]["num_examples"] == 1000 and results[0]["eval"]["accuracy"] > 0.15  # chance: 0.1
    with np.load(tmp_path / "straight0.npz") as a, np.load(tmp_path / "straight1.npz") as b:
        assert len(a.files) == len(b.files) > 0
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
    # Only the chief (worker 0) writes.
    assert results[1]["writes"] == 0 and results[0]["writes"] > 0
    assert (tmp_path / "run" / "model.keras").exists() and (tmp_path / "run" / "results.json").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "ckpt-00000100.npz", "ckpt-00000125.npz"]
    # One epoch: each worker saw its own 2,000 digits once; together, all 4,000.
    seen = [r["image_hashes"] for r in results]
    assert [len(s) for s in seen] == [2000, 2000] and [len(set(s)) for s in seen] == [2000, 2000]
    assert not set(seen[0]) & set(seen[1])

    # Worker 1 dies (kill -9) after step 60, worker 0 is stopped where it waits
    # for it; the same cluster re-run resumes at step 50 and ends where the
    # uninterrupted run ended, bitwise.
    killed = _cluster(tmp_path, tmp_path / "killed", CLUSTER, "killed", kill_at=60)
    assert _finish(killed[1], expect_rc=-9) is None
    killed[0].kill()
    killed[0].communicate()
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())[-1] == "ckpt-00000050.npz"
    resumed = [_finish(w) for w in _cluster(tmp_path, tmp_path / "killed", CLUSTER, "resumed")]
    assert [r["steps_this_session"] for r in resumed] == [75, 75]
    assert resumed[0]["losses"] == results[0]["losses"][50:]
    for index in range(2):
        with np.load(tmp_path / f"straight{index}.npz") as a, np.load(tmp_path / f"resumed{index}.npz") as b:
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# Each run killed with SIGKILL after step kill_at, then resumed; the same run
# uninterrupted is the reference. name -> (overrides, kill_at).
KILL_9 = {
    # Dropout and random translations: the RNG state and the input position must resume too.
    "plain": ({"steps": 8, "checkpoint_every": 3, "deterministic": True, "batch_size": 16,
               "dropout_rate": 0.1, "train_augment": "translate", "learning_rate": 3e-3}, 5),
    # Patch dropout too: its draws come from the model's seed state, which the checkpoint holds.
    "regularised": ({"steps": 8, "checkpoint_every": 3, "deterministic": True, "batch_size": 16,
                     "learning_rate": 3e-3, "patch_dropout": 0.5, **REGULARISED}, 5),
    # DeiT's own settings (RandAugment, random erasing, Mixup/CutMix in groups
    # of 6, repeated augmentation 3, EMA, stochastic depth, warmup in epochs)
    # at batch 7: the resume at step 3 (21 examples) lands inside a mixing group.
    "deit": ({"recipe": "deit", "steps": 6, "checkpoint_every": 3, "deterministic": True, "batch_size": 7,
              "train_augment": "inception_crop_flip", "label_smoothing": 0.1, "ema": 0.9, "image_size": 28}, 4),
}
# The single-worker run that leaves a checkpoint for the chief of
# test_workers_that_restore_different_steps_stop_with_one_line.
CHIEF_FIRST = {"steps": 2, "batch_size": 8, "checkpoint_every": 2}


@pytest.fixture(scope="module")
def kill_9(tmp_path_factory):
    """Each KILL_9 run killed (kill -9 ends its process, so one process each),
    then resumed from its workdir alone; the uninterrupted references, and
    CHIEF_FIRST, one after the other in one process of their own (never the
    resuming one). -> {name: (resumed, straight, checkpoints left by the kill)}, the chief's workdir."""
    root = tmp_path_factory.mktemp("kill_9")
    killed = {name: _launch({"workdir": str(root / name / "resumed"), "kill_at": kill_at, "overrides": overrides})
              for name, (overrides, kill_at) in KILL_9.items()}
    straight = _launch_many([{"workdir": str(root / name / "straight"), "overrides": overrides}
                             for name, (overrides, _) in KILL_9.items()]
                            + [{"workdir": str(root / "chief"), "overrides": CHIEF_FIRST}])
    left = {}
    for name, process in killed.items():
        assert _finish(process, expect_rc=-9) is None
        left[name] = sorted(p.name for p in (root / name / "resumed" / "checkpoints").iterdir())
    # One fresh process resumes the three killed runs: all it has of them is their workdirs.
    resumed = _finish(_launch_many([{"workdir": str(root / name / "resumed"), "overrides": overrides}
                                    for name, (overrides, _) in KILL_9.items()]), every=True)
    straight = _finish(straight, every=True)
    assert len(resumed) == len(KILL_9) and len(straight) == len(KILL_9) + 1
    runs = {name: (resumed[i], straight[i], left[name]) for i, name in enumerate(KILL_9)}
    return root, runs


def _kill_9_and_resume(kill_9, name):
    """The run killed with SIGKILL after step `kill_at`, resumed, and the same
    run uninterrupted: the losses after the checkpoint, and every array of
    the last checkpoint (weights, their moving averages, moments, step, RNG),
    must be equal bit for bit. -> (resumed, straight) results."""
    root, runs = kill_9
    resumed, straight, _ = runs[name]
    overrides, kill_at = KILL_9[name]
    steps, every = overrides["steps"], overrides["checkpoint_every"]
    restart = kill_at // every * every
    assert resumed["steps"] == steps
    assert resumed["steps_this_session"] == steps - restart and resumed["losses"] == straight["losses"][restart:]
    last = f"ckpt-{steps:08d}.npz"
    a = checkpoint_arrays(root / name / "resumed" / "checkpoints" / last)
    b = checkpoint_arrays(root / name / "straight" / "checkpoints" / last)
    assert a.keys() == b.keys()
    for key in a:  # model weights, dropout RNG, optimizer moments and step
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    return resumed, straight


def test_kill_9_and_resume_equals_an_uninterrupted_run(kill_9):
    assert kill_9[1]["plain"][2] == ["ckpt-00000003.npz"]  # what the kill after step 5 left
    resumed, straight = _kill_9_and_resume(kill_9, "plain")
    assert resumed["steps"] == 8 and resumed["steps_this_session"] == 5
    assert resumed["eval"] == straight["eval"]


def test_kill_9_and_resume_with_every_augmentation_and_regulariser(kill_9):
    resumed, straight = _kill_9_and_resume(kill_9, "regularised")
    assert resumed["eval"] == straight["eval"]


def test_kill_9_and_resume_with_the_deit_recipe_ends_bitwise_equal(kill_9):
    _kill_9_and_resume(kill_9, "deit")
    plan = json.loads((kill_9[0] / "deit" / "straight" / "config.json").read_text())["plan"]
    assert [op["op"] for op in plan["augmentation"]] == [
        "inception_crop", "flip", "randaugment", "to_model_range", "random_erasing", "mix"]


def test_workers_that_restore_different_steps_stop_with_one_line(kill_9, tmp_path):
    """Each worker its own workdir (storage not shared): the chief's holds a
    checkpoint (CHIEF_FIRST's, from the kill_9 fixture's reference process),
    the worker's none. Training on would be two different runs."""
    chief = kill_9[0] / "chief"
    assert (chief / "checkpoints" / "ckpt-00000002.npz").exists()
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    for index, workdir in enumerate((chief, tmp_path / "worker")):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        spec = {"workdir": str(workdir), "overrides": {**CHIEF_FIRST, "steps": 4, "strategy": "multi_worker"}}
        workers.append(_launch(spec, env={"TF_CONFIG": tf_config}))
    for worker in workers:
        out, err = worker.communicate(timeout=TIMEOUT)
        assert worker.returncode != 0
        assert "The workers restored different steps" in err, err[-3000:]


def test_two_worker_cluster_with_every_augmentation_and_regulariser_resumes_bitwise(tmp_path):
    overrides = {"steps": 20, "batch_size": 32, "learning_rate": 1e-2, "checkpoint_every": 5,
                 "deterministic": True, "steps_per_loop": 5, **REGULARISED}
    straight = [_finish(w) for w in _cluster(tmp_path, tmp_path / "run", overrides, "straight")]
    assert straight[0]["losses"] == straight[1]["losses"]
    killed = _cluster(tmp_path, tmp_path / "killed", overrides, "killed", kill_at=12)
    assert _finish(killed[1], expect_rc=-9) is None
    killed[0].kill()
    killed[0].communicate()
    resumed = [_finish(w) for w in _cluster(tmp_path, tmp_path / "killed", overrides, "resumed")]
    assert resumed[0]["losses"] == straight[0]["losses"][10:]
    for index in range(2):
        with np.load(tmp_path / f"straight{index}.npz") as a, np.load(tmp_path / f"resumed{index}.npz") as b:
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
