"""Tasks: the one registry, make_task, and top-k accuracy that never counts a
tie with the true class as a hit (classification and masked patches alike)."""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import cli
from keras_vit.training.config import TrainConfig
from keras_vit.tasks import (
    RECIPE_TASKS, TASKS, ClassificationTask, MaskedPatchTask, Task, make_task, top_k_hits)
from keras_vit.tasks.masked_patch import masked_patch_loss


def numpy_top_k(logits, labels, k):
    """Reference: the true class's rank counting every other class with a
    logit >= its own (the worst rank among ties); a hit if that rank < k."""
    logits = np.asarray(logits, np.float64).reshape(-1, logits.shape[-1])
    labels = np.asarray(labels).reshape(-1)
    hits = []
    for row, label in zip(logits, labels):
        order = np.argsort(-row, kind="stable")
        tied_or_better = [c for c in order if c != label and row[c] >= row[label]]
        hits.append(float(len(tied_or_better) < k))
    return np.array(hits)


def test_top_k_hits_equal_a_numpy_rank_with_ties():
    rng = np.random.default_rng(0)
    # Logits on a coarse grid: many ties, some with the true class.
    logits = rng.integers(-2, 3, size=(64, 7)).astype("float32")
    logits[0] = 0.0  # all tie
    logits[1] = [5, 5, 1, 1, 1, 1, 1]  # the true class 0 ties with one other
    labels = rng.integers(0, 7, size=64).astype("int32")
    labels[:2] = 0
    for k in (1, 2, 5, 7, 10):
        got = top_k_hits(tf.constant(logits), tf.constant(labels), k).numpy()
        np.testing.assert_array_equal(got, numpy_top_k(logits, labels, k), err_msg=f"k={k}")
    assert top_k_hits(logits[:2], labels[:2], 1).numpy().tolist() == [0.0, 0.0]
    assert top_k_hits(logits[:2], labels[:2], 2).numpy().tolist() == [0.0, 1.0]
    # k >= number of classes: every class is in the top k, ties or not.
    assert top_k_hits(logits[:1], labels[:1], 7).numpy().tolist() == [1.0]
    # Where tf.nn.in_top_k counts ties as hits.
    assert bool(tf.nn.in_top_k(labels[:1], logits[:1], 5)[0])
    assert top_k_hits(logits[:1], labels[:1], 5).numpy().tolist() == [0.0]


def test_top_k_hits_on_distinct_logits_is_in_top_k_and_a_nan_is_a_miss():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 5, 12)).astype("float32")  # (B, N, K), as masked patches use it
    labels = rng.integers(0, 12, size=(3, 5)).astype("int32")
    for k in (1, 5):
        expected = tf.reshape(tf.nn.in_top_k(labels.reshape(-1), logits.reshape(-1, 12), k), (3, 5))
        np.testing.assert_array_equal(top_k_hits(logits, labels, k).numpy(), tf.cast(expected, tf.float32).numpy())
    logits[0, 0, labels[0, 0]] = np.nan
    assert top_k_hits(logits, labels, 5).numpy()[0, 0] == 0.0


def test_masked_patch_metrics_use_the_same_rule():
    # Every logit ties: a miss at top-1 and top-5 (the corrupted patch of each image counts).
    logits = tf.zeros((2, 3, 8))
    targets = tf.constant([[1, 2, 3], [4, 5, 6]])
    corrupted = tf.constant([[1, 0, 0], [0, 1, 1]], tf.float32)
    _, metrics = masked_patch_loss(logits, targets, corrupted)
    assert metrics["accuracy"].numpy().tolist() == [0.0, 0.0] and metrics["top5"].numpy().tolist() == [0.0, 0.0]
    # The true class strictly ahead of all but 4: a top-5 hit, a top-1 miss.
    rising = tf.tile(tf.range(8, dtype=tf.float32)[None, None], (2, 3, 1))
    targets = tf.fill((2, 3), 3)
    _, metrics = masked_patch_loss(rising, targets, corrupted)
    assert metrics["accuracy"].numpy().tolist() == [0.0, 0.0] and metrics["top5"].numpy().tolist() == [1.0, 1.0]


def test_one_registry_and_make_task():
    from keras_vit.tasks import DepthTask, ImageTextTask, SegmentationTask

    assert TASKS == {"classification": ClassificationTask, "masked_patch": MaskedPatchTask,
                     "image_text": ImageTextTask, "segmentation": SegmentationTask, "depth": DepthTask}
    assert all(issubclass(task, Task) for task in TASKS.values())
    assert RECIPE_TASKS == {"masked_patch": "masked_patch", "siglip": "image_text", "clip": "image_text"}
    scratch = TrainConfig.create("scratch", model="Mu/4", workdir="w")
    task = make_task(scratch)
    assert type(task) is ClassificationTask and task.label_smoothing == 0.1  # the recipe's
    assert type(make_task(TrainConfig.create("masked_patch", model="Mu/4", workdir="w"))) is MaskedPatchTask
    assert type(make_task(scratch.replace(task="masked_patch"))) is MaskedPatchTask
    with pytest.raises(ValueError, match="Unknown task 'colour': give one of classification, depth, image_text, masked_patch, segmentation, or a Task of your own"):
        make_task(scratch.replace(task="colour"))


@pytest.mark.slow
def test_train_cli_with_zero_steps_evaluates_the_zero_head_at_initialisation(tmp_path, capsys):
    # A fresh model's head is zero: every logit ties, so no top-k hit at all
    # (tf.nn.in_top_k reported top-5 1.0 here).
    workdir = str(tmp_path / "run")
    code = cli.main(["train", "--model", "Nano/4", "--patch-size", "7", "--recipe", "scratch", "--dataset", "mnist5k",
                     "--steps", "0", "--eval-batch-size", "500", "--workdir", workdir, "--no-progress"])
    assert code == 0
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert results["steps"] == 0 and results["eval"]["num_examples"] == 1000
    assert results["eval"]["loss"] == pytest.approx(math.log(10), abs=1e-5)  # uniform softmax: all ties
    assert results["eval"]["accuracy"] == 0.0 and results["eval"]["top5"] == 0.0
    out = capsys.readouterr().out  # the run's description (kept by --no-progress, #37), then the summary
    summary = json.loads(out[out.index("{\n"):].split("\nwrote ")[0])
    assert summary["eval_top5"] == 0.0 and summary["eval_top1"] == 0.0
