"""Position-embedding types (the paper's Appendix D.4, Table 8), in miniature.

    python experiments/position_embeddings.py [--quick] [--seeds N] [--out DIR]

The paper: no position embedding is clearly worse (ImageNet 5-shot 61.4% for
ViT-B/16) while 1-D (64.2%), 2-D (64.0%) and relative (64.0%) embeddings are
about the same, so it uses 1-D. Here: the micro ViT (the Mu row at half width: 64, 4 blocks,
4 heads) trained from scratch with each ViTConfig.position_embedding, equal
steps, on two tasks built from the bundled digits:

- "digits": the 28 x 28 digits themselves (7 x 7 patches, a 4 x 4 grid), where
  a bag of patches already says a lot about the digit;
- "left digit": two digits of different classes side by side on a 32 x 64
  canvas, each jittered by up to 4 pixels, labelled with the LEFT one
  (8 x 8 patches, a 4 x 8 grid): without positions the model cannot know which
  of the two digits it is asked for.

Writes results.json, results.md (mean ± std over seeds) and plot.png.
"""

from __future__ import annotations

import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, REPO)

from experiments import common  # noqa: E402

NAME = "position_embeddings"
CLAIM = ("No position embedding is clearly worse; 1-D learned, 2-D learned and relative embeddings perform "
         "about the same (Appendix D.4, Table 8).")
KINDS = ("none", "learned_1d", "learned_2d", "sincos_2d", "relative")
QUICK_KINDS = ("none", "relative")
# Table 8: ViT-B/16, ImageNet 5-shot linear, embedding added once after the stem (%).
PAPER = {"none": 61.382, "learned_1d": 64.206, "learned_2d": 64.001, "relative": 64.032}
# Equal budgets within a task; the left-digit task (2x the tokens, a harder question) gets more.
STEPS = {"digits": 200, "left digit": 300}
QUICK_STEPS = 4
PATCH = {"digits": 7, "left digit": 8}
TRAIN_EXAMPLES, TEST_EXAMPLES = 4000, 1000


def datasets():
    """{task: None (the trainer's own "mnist5k") or a (train, eval) pair of tf.data datasets}."""
    (train_x, train_y), (test_x, test_y) = common.digits()
    # The left-digit canvases: train from the 4,000 training digits, test from the 1,000 held-out ones.
    train = common.two_digit_canvas(train_x, train_y, TRAIN_EXAMPLES, seed=1)
    test = common.two_digit_canvas(test_x, test_y, TEST_EXAMPLES, seed=2)
    return {"digits": None, "left digit": common.as_datasets(train, test)}


def main(argv=None):
    args = common.parse_args(NAME, __doc__.splitlines()[0], argv)
    started = time.time()
    data = datasets()
    kinds = QUICK_KINDS if args.quick else KINDS
    steps = {task: QUICK_STEPS for task in STEPS} if args.quick else STEPS
    arms = [{"task": task, "position_embedding": kind} for task in STEPS for kind in kinds]

    def run(arm, seed, workdir):
        model = common.micro_model(args.quick, patch_size=PATCH[arm["task"]],
                                   position_embedding=arm["position_embedding"])
        return common.train_run(workdir, model, seed, steps[arm["task"]], args.quick, dataset=data[arm["task"]])

    records = common.run_grid(arms, args.seeds, args.runs, run)
    rows = common.summarise(records, ("task", "position_embedding"), extra=("params",))
    by = {(r["task"], r["position_embedding"]): r for r in rows}
    columns = [("position embedding", lambda kind: kind)]
    columns += [(f"{task} ({steps[task]} steps)", (lambda t: lambda kind: common.mean_std(by[(t, kind)]))(task))
                for task in STEPS]
    columns += [("parameters (digits)", lambda kind: f"{by[('digits', kind)]['params']:,}")]
    columns += [("paper: ImageNet 5-shot, ViT-B/16", lambda kind: f"{PAPER[kind]:.2f}" if kind in PAPER else "-")]
    table = common.markdown_table(kinds, columns)
    common.plot_bars(os.path.join(args.out, "plot.png"), rows, groups="task",
                     bars="position_embedding",
                     title="Position embeddings: micro ViT from scratch, equal steps")
    settings = {"model": common.model_sizes(common.micro_model(args.quick)).rsplit(", ", 1)[0] + ", GAP classifier",
                "steps": steps,
                "patch_size": PATCH, "seeds": args.seeds, "quick": args.quick, "test_examples": TEST_EXAMPLES,
                "recipe": "scratch: AdamW lr 2e-3, wd 0.05, batch 128, 10% warmup + cosine, label smoothing 0.1, "
                          "no augmentation"}
    notes = ("digits: the bundled 28 x 28 digits, 7 x 7 patches. left digit: two digits of different classes on a "
             "32 x 64 canvas, label = the left one, 8 x 8 patches; a bag of patches (none) cannot tell left from "
             "right. Paper column: Table 8 (no position, 1-D, 2-D, relative; sin-cos was not in it).")
    return common.write_results(args.out, NAME, CLAIM, settings, rows, records, table, notes, started)


if __name__ == "__main__":
    main()
