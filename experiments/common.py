"""What the design-claim experiments share: the command line, one training run
through the trainer, seeds, the mean +- std table (Markdown and JSON), the plots,
the harder two-digit data set and a FLOPs count.

Every run is `keras_vit.training.train` on the bundled MNIST digits (4,000 train
/ 1,000 test, `keras_vit.data.mnist5k.split`) or on data built from them
here, with the `scratch` recipe and the same settings for every arm except the
one factor under test. Each run gets its own workdir, named after its settings:
re-running an experiment skips the runs that already finished (the trainer
returns their recorded results) and resumes an interrupted one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- command line ----------------------------------------------------------------

def parse_args(name: str, description: str, argv=None, default_seeds: int = 3) -> argparse.Namespace:
    """`python experiments/NAME.py [--quick] [--seeds N] [--out DIR] [--runs DIR]`."""
    parser = argparse.ArgumentParser(prog=f"experiments/{name}.py", description=description)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of about a minute: fewer arms and steps, one seed, one block, no XLA")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"seeds per arm (default: {default_seeds}; 1 with --quick)")
    parser.add_argument("--out", default=None,
                        help=f"where results.json, results.md and plot.png go (default: docs/experiments/{name}, "
                             f"or runs/experiments/{name}-quick with --quick)")
    parser.add_argument("--runs", default=None,
                        help=f"the training workdirs (default: runs/experiments/{name}[-quick])")
    args = parser.parse_args(argv)
    if args.seeds is None:
        args.seeds = 1 if args.quick else default_seeds
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    suffix = "-quick" if args.quick else ""
    args.out = args.out or (os.path.join("runs", "experiments", name + suffix) if args.quick
                            else os.path.join("docs", "experiments", name))
    args.runs = args.runs or os.path.join("runs", "experiments", name + suffix)
    os.makedirs(args.out, exist_ok=True)
    return args


# --- one run -----------------------------------------------------------------------

def slug(settings: dict) -> str:
    """A workdir name that says what ran: "position_embedding=relative-seed=1-steps=300"."""
    parts = []
    for key, value in settings.items():
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={text}")
    return re.sub(r"[^A-Za-z0-9=._-]+", "_", "-".join(parts))


def train_run(workdir: str, model, seed: int, steps: int, quick: bool, dataset=None, **overrides) -> dict:
    """One run of the `scratch` recipe; returns the record of the table.

    Fixed for every arm of every experiment: no augmentation (nothing that
    moves a digit, so position means the same in train and test), a linear
    warmup over the first 10% of the steps then cosine decay, label
    smoothing 0.1, AdamW (lr 2e-3, weight decay 0.05), batch 128, the GAP
    classifier: the recipe's values, unless an experiment overrides one as
    its factor. `dataset`: None for the bundled digits ("mnist5k"), or a
    (train, eval) pair of tf.data datasets.
    """
    from keras_vit.training import TrainConfig, train

    settings = dict(
        model=model, dataset="mnist5k", workdir=workdir, seed=seed, steps=steps,
        warmup_steps=max(1, steps // 10), train_augment="none", num_classes=10, progress=False,
        # float32 whatever the CPU, as the published figures (auto would take bfloat16 on some).
        strategy="default", precision="float32", jit_compile=not quick, checkpoint_every=steps, keep_checkpoints=1,
        log_every=min(50, steps), eval_batch_size=500,
    )
    settings.update(overrides)
    started = time.time()
    results = train(TrainConfig.create("scratch", **settings), dataset=dataset)
    return {
        "accuracy": float(results["eval"]["accuracy"]),
        "loss": float(results["eval"]["loss"]),
        "steps": int(results["steps"]),
        "params": int(results.get("num_params") or 0),
        "images_per_sec": results.get("images_per_sec"),
        "wall_seconds": float(results.get("wall_time_s") or time.time() - started),
        "already_finished": bool(results.get("already_finished")),
        # Accuracy along the way (eval_every), for time-to-accuracy curves.
        "eval_history": [(int(e["step"]), float(e["accuracy"])) for e in results.get("eval_history", [])],
    }


def run_grid(arms: Sequence[dict], seeds: int, runs_dir: str, run: Callable[[dict, int, str], dict]) -> List[dict]:
    """Every arm (a dict of its factors) for seeds 0..seeds-1, in that order;
    `run(arm, seed, workdir)` trains one and returns its record. Prints one
    line per run with an estimate of the time left."""
    records, started, total = [], time.time(), len(arms) * seeds
    for seed in range(seeds):  # seed-major: a partial run already has every arm once
        for arm in arms:
            workdir = os.path.join(runs_dir, slug({**arm, "seed": seed}))
            record = {**arm, "seed": seed, **run(arm, seed, workdir)}
            records.append(record)
            done = len(records)
            left = (time.time() - started) / done * (total - done)
            note = " (already finished)" if record["already_finished"] else ""
            print(f"[{done}/{total}] {describe(arm)} seed {seed}: top-1 {record['accuracy']:.4f}, "
                  f"{record['wall_seconds']:.0f}s{note}; about {left / 60:.1f} min left", flush=True)
    return records


def describe(arm: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in arm.items())


# --- the table -------------------------------------------------------------------

def summarise(records: Sequence[dict], factors: Sequence[str], extra: Sequence[str] = ()) -> List[dict]:
    """One row per arm (the distinct values of `factors`, in first-seen order):
    mean and sample std over seeds of the test accuracy, plus the mean of each
    `extra` field (None where no run has it)."""
    groups: Dict[tuple, List[dict]] = {}
    for record in records:
        groups.setdefault(tuple(record[f] for f in factors), []).append(record)
    rows = []
    for key, members in groups.items():
        accuracies = [m["accuracy"] for m in members]
        row = dict(zip(factors, key))
        row.update(accuracy_mean=statistics.fmean(accuracies),
                   accuracy_std=statistics.stdev(accuracies) if len(accuracies) > 1 else None,
                   seeds=len(accuracies))
        for field in extra:
            values = [m[field] for m in members if m.get(field) is not None]
            # Equal values (a parameter count) stay as they are; others are averaged.
            row[field] = (values[0] if len(set(values)) == 1 else statistics.fmean(values)) if values else None
        rows.append(row)
    return rows


def mean_std(row: dict) -> str:
    """"97.12 ± 0.31" (percent), or "97.12" for a single seed."""
    text = f"{100 * row['accuracy_mean']:.2f}"
    return text if row["accuracy_std"] is None else f"{text} ± {100 * row['accuracy_std']:.2f}"


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple]) -> str:
    """columns: (header, function of a row -> text)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(f(row)) for _, f in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out_dir: str, experiment: str, claim: str, settings: dict, rows: List[dict],
                  records: List[dict], table: str, notes: str, started: float) -> dict:
    """results.json (settings, rows, every run) and results.md (the table and notes)."""
    os.makedirs(out_dir, exist_ok=True)
    report = {"experiment": experiment, "claim": claim, "settings": settings, "rows": rows, "runs": records,
              "total_seconds": time.time() - started}
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    minutes = report["total_seconds"] / 60
    seeds = settings["seeds"]
    text = (f"{table}\n\nTest top-1 on {settings['test_examples']} held-out examples, mean ± sample std over "
            f"{seeds} seed{'s' if seeds > 1 else ''} (seeds vary the initialisation and the data order). "
            f"{notes} {len(records)} runs, {minutes:.1f} min.\n")
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, flush=True)
    return report


# --- plots -----------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bars(path: str, rows: Sequence[dict], groups: str, bars: str, title: str, ylabel="test top-1 (%)"):
    """Grouped bars: one group per value of `groups`, one bar per value of `bars`, std as error bars."""
    plt = _pyplot()
    group_values = list(dict.fromkeys(r[groups] for r in rows))
    bar_values = list(dict.fromkeys(r[bars] for r in rows))
    width = 0.8 / len(bar_values)
    figure, ax = plt.subplots(figsize=(max(6, 1.6 * len(group_values) * len(bar_values) ** 0.5), 4.2))
    for i, bar in enumerate(bar_values):
        xs, ys, errors = [], [], []
        for j, group in enumerate(group_values):
            row = next((r for r in rows if r[groups] == group and r[bars] == bar), None)
            if row is not None:
                xs.append(j + (i - (len(bar_values) - 1) / 2) * width)
                ys.append(100 * row["accuracy_mean"])
                errors.append(100 * (row["accuracy_std"] or 0.0))
        ax.bar(xs, ys, width, yerr=errors, capsize=3, label=str(bar))
    ax.set_xticks(range(len(group_values)))
    ax.set_xticklabels([str(g) for g in group_values])
    low = min(100 * r["accuracy_mean"] for r in rows)
    ax.set_ylim(max(0.0, math.floor(low / 10) * 10 - 10), 100)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_lines(path: str, rows: Sequence[dict], x: str, series: str, title: str, xlabel: str,
               log_x: bool = True, ylabel="test top-1 (%)"):
    """One line per value of `series` through (row[x], accuracy), std as error bars."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in dict.fromkeys(r[series] for r in rows):
        points = sorted((r[x], 100 * r["accuracy_mean"], 100 * (r["accuracy_std"] or 0.0))
                        for r in rows if r[series] == name)
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                    marker="o", capsize=3, label=str(name))
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


# --- the model -----------------------------------------------------------------

# --quick's depth: a quick run's time is almost all the tracing of each run's
# training and evaluation graphs (a few seconds per block on a CPU), not its steps.
QUICK_NUM_LAYERS = 1


def micro_model(quick: bool = False, **changes):
    """The experiments' ViT: the Mu row of keras_vit/variants.py at half its width
    and MLP, so that an experiment's arms x seeds fit in about 20 minutes on 2
    cores (the demo trains the full Mu width); with `quick` (--quick), one block
    instead of four; `changes` as in ViTConfig.replace."""
    from keras_vit.variants import get_variant

    mu = get_variant("Mu/4")
    depth = {"num_layers": QUICK_NUM_LAYERS} if quick else {}
    return mu.replace(**{"hidden_size": mu.hidden_size // 2, "mlp_dim": mu.mlp_dim // 2, **depth, **changes})


def model_sizes(config) -> str:
    """A model's sizes, for the results' settings."""
    return (f"width {config.hidden_size}, {config.num_layers} blocks, {config.num_heads} heads, "
            f"mlp {config.mlp_dim}, {config.patch_size} x {config.patch_size} patches")


# --- data ------------------------------------------------------------------------

def digits():
    """The bundled digits: ((train images (4000, 28, 28, 1) uint8, labels), (test ..., labels))."""
    from keras_vit.data import mnist5k

    return mnist5k.split()


def two_digit_canvas(images: np.ndarray, labels: np.ndarray, count: int, seed: int, jitter: int = 4):
    """`count` canvases of 32 x 64 pixels, each holding two digits of different
    classes, one in each 32 x 32 half at a random offset of 0..jitter pixels
    (rows and columns); the label is the class of the LEFT digit.

    Without a position embedding a ViT sees a bag of patches: both digits are
    in it and nothing says which is on the left, so it cannot beat about half
    of its digit accuracy. Any kind of position information lets it tell
    left from right. The two halves are drawn alike, so nothing but position
    separates them. Returns (uint8 (count, 32, 64, 1), int32 labels (count,)).
    """
    rng = np.random.default_rng(seed)
    side = images.shape[1]
    if side + jitter > 32:
        raise ValueError(f"{side}-pixel digits with a jitter of {jitter} do not fit a 32-pixel half.")
    canvas = np.zeros((count, 32, 64, images.shape[-1]), np.uint8)
    left = rng.integers(0, len(labels), size=count)
    right = rng.integers(0, len(labels), size=count)
    clash = labels[left] == labels[right]
    while clash.any():  # two different classes, so the label says which digit was meant
        right[clash] = rng.integers(0, len(labels), size=int(clash.sum()))
        clash = labels[left] == labels[right]
    offsets = rng.integers(0, jitter + 1, size=(count, 2, 2))  # (example, digit, (row, col))
    for n in range(count):
        for half, index in enumerate((left[n], right[n])):
            row, col = offsets[n, half]
            col += 32 * half
            canvas[n, row:row + side, col:col + side] = images[index]
    return canvas, labels[left].astype(np.int32)


def as_datasets(train, test):
    """(train, eval) tf.data datasets of (image, label) for train(config, dataset=...)."""
    import tensorflow as tf

    return (tf.data.Dataset.from_tensor_slices(train), tf.data.Dataset.from_tensor_slices(test))


# --- compute -----------------------------------------------------------------------

def forward_flops(config, image_size, channels: int) -> int:
    """FLOPs (2 x multiply-adds) of one image's forward pass through the
    convolutions and matmuls of a ViT or hybrid (norms, softmax, GELU and the
    head left out: small beside them). A training step costs about 3x this
    per image (forward + backward)."""
    height, width = image_size
    flops = 0
    if config.resnet is not None:
        base = config.resnet.width
        height, width = -(-height // 2), -(-width // 2)
        flops += 2 * height * width * 7 * 7 * channels * base  # conv_root, stride 2
        height, width = -(-height // 2), -(-width // 2)  # max-pool, stride 2
        channels = base
        for stage, units in enumerate(config.resnet.num_layers):
            features = base * 2 ** stage
            for unit in range(units):
                stride = 2 if stage > 0 and unit == 0 else 1
                out_h, out_w = -(-height // stride), -(-width // stride)
                flops += 2 * height * width * channels * features  # conv1 1x1
                flops += 2 * out_h * out_w * 9 * features * features  # conv2 3x3, the stride
                flops += 2 * out_h * out_w * features * 4 * features  # conv3 1x1
                if channels != 4 * features or stride != 1:
                    flops += 2 * out_h * out_w * channels * 4 * features  # projection
                height, width, channels = out_h, out_w, 4 * features
    patch, hidden = config.patch_size, config.hidden_size
    patches = (height // patch) * (width // patch)
    flops += 2 * patches * patch * patch * channels * hidden
    tokens = patches + (1 if config.classifier == "token" else 0)
    block = (2 * tokens * hidden * 4 * hidden  # query, key, value, out
             + 2 * 2 * tokens * tokens * hidden  # logits and the weighted sum
             + 2 * 2 * tokens * hidden * config.mlp_dim)  # the MLP
    return int(flops + config.num_layers * block)


def mean_of(records: Sequence[dict], field: str) -> Optional[float]:
    values = [r[field] for r in records if r.get(field) is not None]
    return statistics.fmean(values) if values else None
