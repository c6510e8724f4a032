"""tf.distribute in fresh processes: mirrored on 2 logical CPUs, 2-process
multi-worker on localhost, and kill -9 + resume under op determinism."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

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


# The three mirrored checks' runs, in one fresh process on 2 logical CPUs:
# each comparison's MirroredStrategy run, then the same on one device.
# XLA-compiled per-replica steps, global batch 16 = 2 replicas x 8. (The
# regularised first: its XLA program compiles in 11 s as the process's first
# run, 20 s after another.)
MIRRORED = {
    "regularised": {"steps": 3, "batch_size": 16, "jit_compile": True, **REGULARISED},
    "plain": {"steps": 3, "batch_size": 16, "jit_compile": True},
    # LoRA (#39) from official-format weights ("@base": the worker writes them).
    "lora": {"steps": 3, "batch_size": 16, "jit_compile": False, "weights": "@base", "lora_rank": 2,
             "lora_targets": ["query", "key", "value", "out", "mlp"], "learning_rate": 0.01},
    # #54: a loss over the step's whole batch (keras_vit.tasks.across_replicas), and the same loss
    # over each replica's half, which must not equal one device.
    "gathered": {"steps": 3, "batch_size": 16, "jit_compile": True, "learning_rate": 0.05,
                 "task": "tests.pixel_task:CentredTask"},
    "local": {"steps": 3, "batch_size": 16, "jit_compile": True, "learning_rate": 0.05,
              "task": "tests.pixel_task:LocalCentredTask"},
    # #56: a per-pixel task (DINOv3 saved by transformers, depth under a DPT head, silog's per-image
    # loss): each replica's maps, summed over both, train as one device's.
    "depth": {"task": "depth", "head": "dpt", "weights": "@dinov3", "dataset": "@depths", "model": None, "steps": 3,
              "batch_size": 8, "eval_batch_size": 8, "image_size": 32, "jit_compile": True, "learning_rate": 3e-3},
}


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """{name: result} of each MIRRORED comparison; the plain one's mirrored run
    also counts the all-reduces that carry the gradients while it is traced."""
    root = tmp_path_factory.mktemp("mirrored")
    _write_scenes_and_dinov3(root)
    comparisons = {name: _placed(overrides, root) for name, overrides in MIRRORED.items()}
    worker = _launch({"workdir": str(root), "logical_cpus": 2,
                      "mirrored_vs_one_device": True, "comparisons": comparisons, "count_all_reduces": ["plain"]})
    # Its comparisons run one after another, each a mirrored and a one-device run: each comparison
    # gets a run's time limit (one limit for all six timed out once under the other worker's load).
    worker.runs = len(MIRRORED)
    results = _finish(worker, every=True)
    assert [r["name"] for r in results] == list(MIRRORED)
    return {r["name"]: r for r in results}


def test_mirrored_on_two_devices_equals_one_device(mirrored):
    result = mirrored["plain"]
    assert result["replicas"] == {"one_device": 1, "mirrored": 2}
    assert result["steps"] == {"one_device": 3, "mirrored": 3} and len(result["losses"]["mirrored"]) == 3
    assert result["max_weight_difference"] < 1e-5 * max(1.0, result["max_weight"]), result
    np.testing.assert_allclose(result["losses"]["one_device"], result["losses"]["mirrored"], rtol=1e-5)
    assert abs(result["eval_loss"]["one_device"] - result["eval_loss"]["mirrored"]) < 1e-4


def test_a_mirrored_step_all_reduces_the_gradients_once(mirrored):
    # Traced under two replicas (one trace of the loop: its length is a
    # tensor): each replica's step carries the gradients into exactly one
    # all-reduce (Keras' optimizer would sum them again).
    result = mirrored["plain"]["all_reduces"]
    assert result["replicas"] == 2 and result["steps"] == 3
    assert result["gradient_all_reduces"] == result["replicas"], result  # one per replica, per traced step


def test_mirrored_equals_one_device_with_every_augmentation_and_regulariser(mirrored):
    result = mirrored["regularised"]
    assert result["replicas"] == {"one_device": 1, "mirrored": 2}
    assert result["steps"] == {"one_device": 3, "mirrored": 3} and len(result["losses"]["mirrored"]) == 3
    assert result["max_weight_difference"] < 1e-5 * max(1.0, result["max_weight"]), result
    np.testing.assert_allclose(result["losses"]["one_device"], result["losses"]["mirrored"], rtol=1e-5)


def test_mirrored_lora_equals_one_device(mirrored):
    result = mirrored["lora"]  # the updates and the head: what a LoRA run trains
    assert result["replicas"] == {"one_device": 1, "mirrored": 2} and result["steps"]["mirrored"] == 3
    assert result["max_weight_difference"] < 1e-5 * max(1.0, result["max_weight"]), result
    np.testing.assert_allclose(result["losses"]["one_device"], result["losses"]["mirrored"], rtol=1e-5)


def test_a_dinov3_depth_run_on_two_replicas_equals_one_device(mirrored):
    result = mirrored["depth"]
    assert result["replicas"] == {"one_device": 1, "mirrored": 2} and result["steps"]["mirrored"] == 3
    assert result["max_weight_difference"] < 1e-5 * max(1.0, result["max_weight"]), result
    np.testing.assert_allclose(result["losses"]["one_device"], result["losses"]["mirrored"], rtol=1e-5)
    assert abs(result["eval_loss"]["one_device"] - result["eval_loss"]["mirrored"]) < 1e-4


def test_a_loss_over_every_replica_s_examples_trains_as_on_one_device(mirrored):
    gathered, local = mirrored["gathered"], mirrored["local"]
    assert gathered["replicas"] == {"one_device": 1, "mirrored": 2} and gathered["steps"]["mirrored"] == 3
    assert gathered["max_weight_difference"] < 1e-4 * max(1.0, gathered["max_weight"]), gathered
    np.testing.assert_allclose(gathered["losses"]["one_device"], gathered["losses"]["mirrored"], rtol=1e-5)
    # Each replica's own centre instead: another run, so the comparison above can tell them apart.
    assert local["max_weight_difference"] > 100 * gathered["max_weight_difference"], (local, gathered)


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


# Every augmentation and regulariser on a cluster, killed (worker 1, kill -9)
# after step 12 and resumed from step 10.
CLUSTER_REGULARISED = {"steps": 20, "batch_size": 32, "learning_rate": 1e-2, "checkpoint_every": 5,
                       "deterministic": True, "steps_per_loop": 5, **REGULARISED}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """Four 2-worker cluster launches, one after the other: CLUSTER
    uninterrupted ("straight": counting writes, recording the images), then
    CLUSTER_REGULARISED uninterrupted ("reference"), killed ("killed": worker
    1 kill -9 after step 12, worker 0 stopped where it waits for it) and
    resumed from the killed run's workdir by a fresh cluster ("resumed").
    -> (tmp, {name: [worker 0's result, worker 1's]}, the checkpoints the kill left)."""
    tmp = tmp_path_factory.mktemp("clusters")
    runs = {"straight": [_finish(w) for w in _cluster(tmp, tmp / "run", CLUSTER, "straight", count_writes=True,
                                                      record_images=True)],
            "reference": [_finish(w) for w in _cluster(tmp, tmp / "reference", CLUSTER_REGULARISED, "reference")]}
    killed = _cluster(tmp, tmp / "killed", CLUSTER_REGULARISED, "killed", kill_at=12)
    assert _finish(killed[1], expect_rc=-9) is None
    killed[0].kill()
    killed[0].communicate()
    left = sorted(p.name for p in (tmp / "killed" / "checkpoints").iterdir())
    runs["resumed"] = [_finish(w) for w in _cluster(tmp, tmp / "killed", CLUSTER_REGULARISED, "resumed")]
    return tmp, runs, left


def _resumed_bitwise(clusters):
    """The resumed cluster ends where the uninterrupted one ended: its
    losses from the restart on, and each worker's final weights, bitwise."""
    tmp, runs, _ = clusters
    assert [r["losses"] for r in runs["resumed"]] == [r["losses"][10:] for r in runs["reference"]]
    for index in range(2):
        with np.load(tmp / f"reference{index}.npz") as a, np.load(tmp / f"resumed{index}.npz") as b:
            assert a.files == b.files and len(a.files) > 0
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_two_worker_cluster_on_localhost_trains_agrees_and_resumes_a_killed_worker(clusters):
    tmp, runs, left = clusters
    results = runs["straight"]
    assert [r["replicas"] for r in results] == [2, 2]
    assert results[0]["losses"] == results[1]["losses"]  # the all-reduced loss
    assert np.mean(results[0]["losses"][-5:]) < np.mean(results[0]["losses"][:5]) - 0.1, results[0]["losses"]
    assert results[0]["eval"] == results[1]["eval"]  # each evaluates its shard; the sums are all-reduced
    assert results[0]["eval"]["num_examples"] == 1000 and results[0]["eval"]["accuracy"] > 0.15  # chance: 0.1
    with np.load(tmp / "straight0.npz") as a, np.load(tmp / "straight1.npz") as b:
        assert len(a.files) == len(b.files) > 0
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
    # Only the chief (worker 0) writes.
    assert results[1]["writes"] == 0 and results[0]["writes"] > 0
    assert (tmp / "run" / "model.keras").exists() and (tmp / "run" / "results.json").exists()
    assert sorted(p.name for p in (tmp / "run" / "checkpoints").iterdir()) == [
        "ckpt-00000100.npz", "ckpt-00000125.npz"]
    # One epoch: each worker saw its own 2,000 digits once; together, all 4,000.
    seen = [r["image_hashes"] for r in results]
    assert [len(s) for s in seen] == [2000, 2000] and [len(set(s)) for s in seen] == [2000, 2000]
    assert not set(seen[0]) & set(seen[1])

    # Worker 1 died (kill -9) after step 12, worker 0 was stopped where it
    # waited for it (the regularised cluster: the kill and resume of this
    # test and of the next are one); the same cluster re-run resumes at step
    # 10 and ends where the uninterrupted run ended, bitwise.
    assert left[-1] == "ckpt-00000010.npz", left
    assert [r["replicas"] for r in runs["resumed"]] == [2, 2]
    assert [r["steps_this_session"] for r in runs["resumed"]] == [10, 10]
    assert [r["steps"] for r in runs["resumed"]] == [20, 20]
    _resumed_bitwise(clusters)


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
    # LoRA (#39) from the finished CHIEF_FIRST run ("@chief": its workdir): the frozen base, the
    # updates, their moments and the dropout draws must all resume.
    "lora": ({"steps": 8, "checkpoint_every": 3, "deterministic": True, "batch_size": 16, "weights": "@chief",
              "lora_rank": 2, "lora_targets": ["query", "value", "mlp"], "dropout_rate": 0.1,
              "learning_rate": 3e-3}, 5),
    # A SigLIP from scratch on captions (#55): the text tower, the logit scale and bias, the tokenizer
    # learned from the captions again in the resuming process, and the captions' order must all resume.
    "image_text": ({"recipe": "siglip", "dataset": "@captions", "steps": 6, "checkpoint_every": 3,
                    "deterministic": True, "batch_size": 8, "eval_batch_size": 8, "image_size": 28,
                    "train_augment": "translate", "dropout_rate": 0.1, "learning_rate": 3e-3}, 4),
    # Segmentation (#56) from a DINOv3 saved by transformers, under a DPT head on four blocks: the
    # masks' crops and flips, DINOv3's random rotary coordinates and the head must all resume.
    "segmentation": ({"task": "segmentation", "head": "dpt", "weights": "@dinov3", "dataset": "@scenes",
                      "model": None, "steps": 6, "checkpoint_every": 3, "deterministic": True, "batch_size": 4,
                      "eval_batch_size": 4, "image_size": 32, "train_augment": "inception_crop_flip",
                      "learning_rate": 3e-3}, 4),
    # Depth (#56) from the same DINOv3 under a linear head, silog's loss: the depth maps' crops and
    # flips (pixels brought in unknown) and the head must resume too.
    "depth": ({"task": "depth", "head": "linear", "weights": "@dinov3", "dataset": "@depths", "model": None,
               "steps": 6, "checkpoint_every": 3, "deterministic": True, "batch_size": 4, "eval_batch_size": 4,
               "image_size": 32, "train_augment": "inception_crop_flip", "learning_rate": 3e-3}, 4),
}
# The single-worker run that leaves a checkpoint for the chief of
# test_workers_that_restore_different_steps_stop_with_one_line.
CHIEF_FIRST = {"steps": 2, "batch_size": 8, "checkpoint_every": 2}


# Which uninterrupted references each killed run's process trains first
# (never its own run's: that one, and CHIEF_FIRST, are trained elsewhere).
# The LoRA run's own process trains its base, "chief", before it starts; its uninterrupted
# reference needs that base, so it is trained last, after the resumes (REFERENCES_AFTER).
REFERENCES_BEFORE = {"plain": ["depth"], "depth": ["regularised"], "regularised": ["deit"], "deit": ["segmentation"],
                     "segmentation": ["image_text"], "image_text": ["plain"], "lora": ["chief"]}
REFERENCES_AFTER = ["lora"]


def _placed(overrides, root):
    """The overrides with "@chief" (a run's weights) the CHIEF_FIRST run's workdir under `root`, and
    "@captions", "@scenes", "@depths" (datasets) and "@dinov3" (weights) what `kill_9` (or `mirrored`)
    writes there."""
    places = {"@chief": str(root / "chief"), "@captions": f"captions:{root / 'captions' / 'pairs.csv'}",
              "@scenes": f"masks:{root / 'scenes'}", "@depths": f"depth:{root / 'scenes'}",
              "@dinov3": str(root / "dinov3")}
    return {k: places.get(v, v) if isinstance(v, str) else v for k, v in overrides.items()}


def _write_scenes_and_dinov3(root):
    """root/scenes (keras-vit scenes: 16 of 32 px) and root/dinov3, a 4-block DINOv3 saved by transformers."""
    import transformers

    from keras_vit.data.scenes import write_scenes
    from tests.sources_helpers import perturb_torch

    write_scenes(str(root / "scenes"), 16, 32, seed=1)
    config = transformers.DINOv3ViTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                          intermediate_size=64, patch_size=4, image_size=32, num_register_tokens=2)
    model = transformers.DINOv3ViTModel(config).eval()
    perturb_torch(model, 0, scale=0.2)
    model.save_pretrained(root / "dinov3")


def _write_captions(folder, count=40):
    """`count` of the bundled digits as PNGs in folder/img, with pairs.csv captioning each."""
    data = np.load(os.path.join(ROOT, "keras_vit", "data", "mnist5k.npz"))
    os.makedirs(folder / "img")
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    lines = ["image,caption"]
    for i in range(count):
        Image.fromarray(data["images"][i]).save(folder / "img" / f"{i}.png")
        lines.append(f"img/{i}.png,{('the digit {}', 'a handwritten {}')[i % 2].format(words[data['labels'][i]])}")
    (folder / "pairs.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def kill_9(tmp_path_factory):
    """Each KILL_9 run killed (kill -9 ends its process, so one process each),
    then resumed from its workdir alone, in one fresh process that trained
    nothing else. The uninterrupted references, and CHIEF_FIRST, are
    trained before another run is killed, in that run's process
    (REFERENCES_BEFORE: a TensorFlow import fewer than a process of their
    own; never the resuming one). -> the root, {name: (resumed, straight,
    checkpoints left by the kill)}."""
    root = tmp_path_factory.mktemp("kill_9")
    _write_captions(root / "captions")
    _write_scenes_and_dinov3(root)
    runs = {name: {"workdir": str(root / name / "straight"), "overrides": _placed(overrides, root)}
            for name, (overrides, _) in KILL_9.items()}
    runs["chief"] = {"workdir": str(root / "chief"), "overrides": CHIEF_FIRST}
    assert sorted([n for names in REFERENCES_BEFORE.values() for n in names] + REFERENCES_AFTER) == sorted(runs)
    killed = {name: _launch_many([runs[n] for n in REFERENCES_BEFORE[name]] + [
                  {"workdir": str(root / name / "resumed"), "kill_at": kill_at,
                   "overrides": _placed(overrides, root)}])
              for name, (overrides, kill_at) in KILL_9.items()}
    straight, left = {}, {}
    for name, process in killed.items():
        results = _finish(process, expect_rc=-9, every=True)
        assert len(results) == len(REFERENCES_BEFORE[name])  # the killed run printed none
        straight.update(zip(REFERENCES_BEFORE[name], results))
        left[name] = sorted(p.name for p in (root / name / "resumed" / "checkpoints").iterdir())
    # One fresh process resumes the killed runs (all it has of them is their workdirs), then
    # trains the references that need another run's results.
    resumed = _finish(_launch_many([{"workdir": str(root / name / "resumed"), "overrides": _placed(overrides, root)}
                                    for name, (overrides, _) in KILL_9.items()]
                                   + [runs[name] for name in REFERENCES_AFTER]), every=True)
    straight.update(zip(REFERENCES_AFTER, resumed[len(KILL_9):]))
    assert len(resumed) == len(KILL_9) + len(REFERENCES_AFTER) and sorted(straight) == sorted(runs)
    return root, {name: (resumed[i], straight[name], left[name]) for i, name in enumerate(KILL_9)}


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


def test_kill_9_and_resume_of_a_lora_run_ends_bitwise_equal(kill_9):
    resumed, straight = _kill_9_and_resume(kill_9, "lora")
    assert resumed["eval"] == straight["eval"]
    counts = resumed["parameters"]  # the updates of 3 projections (rank 2) and the head train
    assert counts["trainable"] == 2 * (16 + 16) * 2 + 2 * (16 + 32) * 2 + (16 * 10 + 10) < counts["total"]


def test_kill_9_and_resume_of_an_image_text_run_ends_bitwise_equal(kill_9):
    resumed, straight = _kill_9_and_resume(kill_9, "image_text")
    assert resumed["eval"] == straight["eval"] and 0.0 <= resumed["eval"]["retrieval"] <= 1.0
    assert kill_9[1]["image_text"][2] == ["ckpt-00000003.npz"]  # what the kill after step 4 left


def test_kill_9_and_resume_of_a_dinov3_segmentation_run_ends_bitwise_equal(kill_9):
    resumed, straight = _kill_9_and_resume(kill_9, "segmentation")
    assert resumed["eval"] == straight["eval"] and 0.0 <= resumed["eval"]["mean_iou"] <= 1.0


def test_kill_9_and_resume_of_a_dinov3_depth_run_ends_bitwise_equal(kill_9):
    resumed, straight = _kill_9_and_resume(kill_9, "depth")
    assert resumed["eval"] == straight["eval"] and resumed["eval"]["abs_rel"] > 0


def test_workers_that_restore_different_steps_stop_with_one_line(kill_9, tmp_path):
    """Each worker its own workdir (storage not shared): the chief's holds a
    checkpoint (CHIEF_FIRST's, trained by the kill_9 fixture),
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


def test_two_worker_cluster_with_every_augmentation_and_regulariser_resumes_bitwise(clusters):
    _, runs, _ = clusters
    reference = runs["reference"]
    assert [r["replicas"] for r in reference] == [2, 2]
    assert reference[0]["losses"] == reference[1]["losses"] and len(reference[0]["losses"]) == 20
    assert runs["resumed"][0]["losses"] == runs["resumed"][1]["losses"]
    _resumed_bitwise(clusters)
