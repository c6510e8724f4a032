"""experiments/: each design-claim experiment's --quick path through the trainer,
its table and plot, and the pieces they share (the two-digit data, the FLOPs count)."""

import json

import numpy as np
import pytest

from experiments import class_token_vs_gap, common, hybrid_vs_plain, lora_quantized, position_embeddings

PNG = b"\x89PNG\r\n\x1a\n"


def run_quick(module, tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    module.main(["--quick", "--out", str(out), "--runs", str(runs)])
    report = json.loads((out / "results.json").read_text())
    table = (out / "results.md").read_text()
    assert (out / "plot.png").read_bytes()[:8] == PNG
    assert report["settings"]["quick"] and report["settings"]["seeds"] == 1
    for run in report["runs"] + report["rows"]:
        accuracy = run.get("accuracy", run.get("accuracy_mean"))
        assert 0.0 <= accuracy <= 1.0
    assert all(np.isfinite(run["loss"]) for run in report["runs"])
    return report, table


@pytest.mark.slow
def test_position_embeddings_quick(tmp_path):
    report, table = run_quick(position_embeddings, tmp_path)
    arms = {(row["task"], row["position_embedding"]) for row in report["rows"]}
    assert arms == {(task, kind) for task in ("digits", "left digit") for kind in ("none", "relative")}
    assert "| none |" in table and "| relative |" in table and "61.38" in table  # the paper's column


@pytest.mark.slow
def test_class_token_vs_gap_quick(tmp_path):
    report, table = run_quick(class_token_vs_gap, tmp_path)
    arms = {(row["classifier"], row["learning_rate"]) for row in report["rows"]}
    assert arms == {(head, lr) for head in ("token", "gap") for lr in class_token_vs_gap.QUICK_LEARNING_RATES}
    assert "class token" in table and "GAP" in table and "**" in table  # each head's best is marked


@pytest.mark.slow
def test_hybrid_vs_plain_quick(tmp_path):
    report, table = run_quick(hybrid_vs_plain, tmp_path)
    rows = {(row["architecture"], row["steps"]): row for row in report["rows"]}
    assert set(rows) == {(arch, steps) for arch in ("vit", "hybrid") for steps in hybrid_vs_plain.QUICK_BUDGETS}
    # The hybrid's stem costs compute: more FLOPs per step, and more steps cost proportionally more.
    short, long = hybrid_vs_plain.QUICK_BUDGETS
    assert rows[("hybrid", short)]["train_tflops"] > rows[("vit", short)]["train_tflops"] > 0
    np.testing.assert_allclose(rows[("vit", long)]["train_tflops"],
                               long / short * rows[("vit", short)]["train_tflops"])
    assert report["settings"]["params"]["hybrid"] > report["settings"]["params"]["vit"]
    assert "hybrid - ViT" in table


def test_two_digit_canvas_labels_the_left_digit():
    images = np.zeros((20, 28, 28, 1), np.uint8)
    for i in range(20):
        images[i, :, :, 0] = i + 1  # each digit is a flat square of its own value
    labels = np.arange(20) % 10
    canvas, targets = common.two_digit_canvas(images, labels, count=50, seed=0)
    assert canvas.shape == (50, 32, 64, 1) and targets.dtype == np.int32
    for picture, target in zip(canvas[..., 0], targets):
        left, right = picture[:, :32], picture[:, 32:]
        left_value, right_value = left.max(), right.max()
        assert labels[left_value - 1] == target  # the label is the left digit's class
        assert labels[left_value - 1] != labels[right_value - 1]  # two different classes
        for half, value in ((left, left_value), (right, right_value)):
            rows, cols = np.nonzero(half == value)
            assert len(rows) == 28 * 28 and rows.min() <= 4 and cols.min() <= 4  # whole, jittered <= 4 px


def test_forward_flops_counts_the_matmuls_and_the_stem():
    from keras_vit.config import ResNetConfig, ViTConfig

    vit = ViTConfig(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=1, classifier="gap")
    tokens, width = 16, 64
    expected = (2 * tokens * 64 * width  # 8x8x1 patches
                + 2 * tokens * width * 4 * width + 2 * 2 * tokens * tokens * width + 2 * 2 * tokens * width * 128)
    assert common.forward_flops(vit, (32, 32), 1) == expected
    hybrid = vit.replace(patch_size=2, resnet=ResNetConfig(num_layers=()))
    stem = 2 * 16 * 16 * 49 * 64  # 7x7 conv, stride 2, 1 -> 64 channels
    patches = 2 * tokens * (2 * 2 * 64) * width
    assert common.forward_flops(hybrid, (32, 32), 1) == expected - 2 * tokens * 64 * width + stem + patches


def test_table_and_summary():
    records = [{"arm": "a", "accuracy": 0.9}, {"arm": "a", "accuracy": 0.8}, {"arm": "b", "accuracy": 0.5}]
    rows = common.summarise(records, ("arm",))
    assert rows[0]["accuracy_mean"] == pytest.approx(0.85) and rows[0]["seeds"] == 2
    assert rows[0]["accuracy_std"] == pytest.approx(np.std([0.9, 0.8], ddof=1))
    assert common.mean_std(rows[0]) == "85.00 ± 7.07" and common.mean_std(rows[1]) == "50.00"
    assert common.slug({"task": "left digit", "learning_rate": 0.001, "seed": 2}) == \
        "task=left_digit-learning_rate=0.001-seed=2"


@pytest.mark.slow
def test_augreg_quick(tmp_path):
    from experiments import augreg

    report, table = run_quick(augreg, tmp_path)
    arms = {(row["task"], row["fraction"], row["recipe"]) for row in report["rows"] if "task" in row}
    assert arms == {(t, f, r) for t in augreg.TASKS for f in augreg.FRACTIONS for r in augreg.RECIPES}
    speed = {row["patch_dropout"]: row for row in report["rows"] if "patch_dropout" in row}
    assert set(speed) == {0.0, 0.5} and all(row["step_ms"] > 0 for row in speed.values())
    assert "scratch + AugReg" in table and "speed-up" in table and "10% with AugReg" in table


@pytest.mark.slow
def test_lora_quantized_quick(tmp_path):
    out = tmp_path / "out"
    lora_quantized.main(["--quick", "--out", str(out), "--runs", str(tmp_path / "runs")])
    report, table = json.loads((out / "results.json").read_text()), (out / "results.md").read_text()
    assert (out / "plot.png").read_bytes()[:8] == PNG and report["settings"]["seeds"] == 1
    assert all(0.0 <= run["accuracy"] <= 1.0 for run in report["runs"])
    arms = {(row["method"], row["precision"]) for row in report["rows"]}
    assert arms == {(m, p) for m in lora_quantized.METHODS for p in lora_quantized.PRECISIONS}
    lora = next(row for row in report["rows"] if row["method"] == "lora")
    assert 0 < lora["trainable_fraction"] < 0.2 and "| LoRA r=8 (query, value) |" in table
