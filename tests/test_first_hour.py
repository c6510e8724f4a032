"""Issue #22, the training side of a new user's first hour: a default recipe
too big for the machine (#22.1) and figures that mean nothing (#22.10)."""

import json

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.cli import main
from keras_vit.training import memory
from keras_vit.variants import get_variant
from tests import image_files


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three classes of 10 small photos each (9 train, 1 held out)."""
    root = tmp_path_factory.mktemp("photos")
    for c, name in enumerate(("red", "green", "blue")):
        (root / name).mkdir()
        for i in range(10):
            pixels = image_files.picture(seed=10 * c + i)
            pixels[..., c] = 255
            (root / name / f"{i}.png").write_bytes(image_files.encoded(pixels, "PNG"))
    return root


def test_22_1_a_step_far_beyond_the_machine_is_refused_before_building(photos, tmp_path, capsys):
    # The README's first command as a new user types it: finetune is batch 512 at 384 px.
    code = main(["train", "--model", "B/16", "--dataset", f"folder:{photos}", "--steps", "4", "--workdir",
                 str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert any("--batch-size 512 is larger than the training set (27 images)" in line for line in err), err
    line = err[-1]
    assert line.startswith("keras-vit train: error: a training step of B/16 at 384x384 px, 512 images per replica")
    for way_out in ("needs about", "this machine has", "--batch-size", "--accum-steps", "--remat", "--model"):
        assert way_out in line, line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_22_1_the_estimate_matches_the_measured_peaks():
    # benchmarks/results_remat.md: float32, batch 8, 224 px, AdamW (peak RSS, MiB).
    for variant, measured in (("B/16", 4_423), ("L/16", 13_615)):
        estimate = memory.estimate(get_variant(variant), (224, 224), 10, 3, 8, "adamw", "float32").total / 2**20
        assert abs(estimate - measured) / measured < 0.1, (variant, estimate)
    small = memory.estimate(get_variant("B/16"), (224, 224), 10, 3, 8, "adamw", "mixed_bfloat16", remat=True)
    big = memory.estimate(get_variant("B/16"), (224, 224), 10, 3, 8, "adamw", "float32")
    assert small.per_image == pytest.approx(big.per_image / 4) and small.state == big.state


def test_22_1_running_out_of_memory_is_one_line_with_the_ways_out(photos, tmp_path, capsys, monkeypatch):
    from keras_vit.training import steps

    def out_of_memory(self, iterator, num_steps):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[64,577,3072]")

    monkeypatch.setattr(steps.CompiledSteps, "_run_loop", out_of_memory)
    code = main(["train", "--model", "Nano/4", "--patch-size", "8", "--image-size", "32", "--recipe", "scratch",
                 "--dataset", f"folder:{photos}", "--steps", "2", "--warmup-steps", "0", "--batch-size", "4",
                 "--workdir", str(tmp_path / "run"), "--no-progress", "--strategy", "default"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("keras-vit train: error: Out of memory in a training step of Nano/4 at 32x32 px, 4 images "
                             "per replica at a time (1 replica(s)), float32 (about "), err[0]
    assert "--accum-steps" in err[0] and "--remat" in err[0] and "Traceback" not in err[0]


@pytest.mark.slow
def test_22_10_top5_is_not_reported_for_three_classes_and_tensorboard_is_named(photos, tmp_path, capsys):
    workdir = tmp_path / "run"
    code = main(["train", "--model", "Nano/4", "--patch-size", "8", "--image-size", "32", "--recipe", "scratch",
                 "--dataset", f"folder:{photos}", "--steps", "2", "--batch-size", "4", "--workdir", str(workdir),
                 "--strategy", "default", "--eval-every", "1"])
    out = capsys.readouterr()
    assert code == 0
    results = json.loads((workdir / "results.json").read_text())
    assert "top5" not in results["eval"] and "accuracy" in results["eval"]
    summary = json.loads(out.out[out.out.index("{\n"):].split("\nwrote ")[0])
    assert "eval_top5" not in summary and 0.0 <= summary["eval_top1"] <= 1.0
    shown = out.out + out.err
    assert "top-5" not in shown and "step 1: eval top-1" in shown  # the evaluation line of step 1
    assert f"tensorboard --logdir {workdir}/tensorboard" in out.out
    assert np.isfinite(results["eval"]["loss"])


@pytest.mark.slow
def test_22_9_the_ctrl_c_line_starts_a_line_of_its_own(photos, tmp_path, capsys, monkeypatch):
    import signal

    from keras_vit.training import trainer

    def signalled(self):  # Ctrl-C as the first loop runs
        self.raised, self.signum = True, signal.SIGINT
        return self

    monkeypatch.setattr(trainer._StopSignals, "__enter__", signalled)
    code = main(["train", "--model", "Nano/4", "--patch-size", "8", "--image-size", "32", "--recipe", "scratch",
                 "--dataset", f"folder:{photos}", "--steps", "4", "--batch-size", "4", "--workdir",
                 str(tmp_path / "run"), "--strategy", "default"])
    err = capsys.readouterr().err
    assert code == 130
    line = "keras-vit train: Ctrl-C: checkpoint of step 4 written to"  # the end of the loop in flight
    assert line in err and err[err.index(line) - 1] == "\n", err[-400:]  # not on the progress bar's line


def test_22_2_an_unpublished_checkpoint_name_fails_before_the_data_is_read(tmp_path, capsys, monkeypatch):
    from keras_vit.training import data

    monkeypatch.setattr(data, "open_source", None)  # the data must not even be opened
    code = main(["train", "--model", "Ti/16", "--weights", "imagenet21k", "--dataset", f"folder:{tmp_path}",
                 "--workdir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("keras-vit train: error: --weights: No 'imagenet21k' checkpoint is published for ViT Ti/16")
    assert "augreg-imagenet21k" in err[0]


@pytest.mark.slow
def test_a_python_script_that_trains_on_a_folder_exits(photos, tmp_path):
    """train() on decoded files, the batch far larger than the set, in a script of its own: the
    script ends. Its input streams used to live until the interpreter's exit, whose destructor
    then waited forever on a decoder (a tf.numpy_function) the exiting interpreter could not run."""
    import subprocess
    import sys

    script = ("from keras_vit.training import TrainConfig, train\n"
              f"train(TrainConfig.create('finetune', model='Nano/4', dataset='folder:{photos}', image_size=64,"
              f" steps=1, warmup_steps=0, batch_size=512, workdir={str(tmp_path / 'run')!r}, progress=False,"
              " jit_compile=False))\n"
              "print('returned', flush=True)\n")
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as stuck:
        assert "returned" not in (stuck.stdout or b"").decode(), "train() returned, then the script did not exit"
        raise
    assert done.returncode == 0 and "returned" in done.stdout, done.stderr[-2000:]
