"""Class token vs global average pooling (the paper's Appendix D.3, Figure 9), in miniature.

    python experiments/class_token_vs_gap.py [--quick] [--seeds N] [--out DIR]

The paper: a class token and global average pooling (GAP) of the patch tokens
work equally well, but need different learning rates; GAP at the class
token's learning rate did "very poorly". Here: the micro ViT (the Mu row at half width: 64,
4 blocks, 4 heads, 7 x 7 patches) trained from scratch on the bundled digits
with each head (ViTConfig.classifier "token" or "gap") over the same sweep of
AdamW learning rates, equal steps. The paper's claim holds here if both heads
reach about the same best accuracy, at different learning rates.

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

NAME = "class_token_vs_gap"
CLAIM = ("A class token and global average pooling work equally well, but need different learning rates "
         "(Appendix D.3, Figure 9).")
HEADS = ("token", "gap")
LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # 3e-2: the first sweep peaked at its top end
QUICK_LEARNING_RATES = (1e-3, 1e-2)
STEPS, QUICK_STEPS = 400, 4
TEST_EXAMPLES = 1000
HEAD_NAMES = {"token": "class token", "gap": "GAP"}


def main(argv=None):
    args = common.parse_args(NAME, __doc__.splitlines()[0], argv)
    started = time.time()
    rates = QUICK_LEARNING_RATES if args.quick else LEARNING_RATES
    steps = QUICK_STEPS if args.quick else STEPS
    arms = [{"classifier": head, "learning_rate": lr} for head in HEADS for lr in rates]

    def run(arm, seed, workdir):
        model = common.micro_model(args.quick, patch_size=7)
        return common.train_run(workdir, model, seed, steps, args.quick, classifier=arm["classifier"],
                                learning_rate=arm["learning_rate"])

    records = common.run_grid(arms, args.seeds, args.runs, run)
    rows = common.summarise(records, ("classifier", "learning_rate"))
    by = {(r["classifier"], r["learning_rate"]): r for r in rows}
    best = {head: max((r for r in rows if r["classifier"] == head), key=lambda r: r["accuracy_mean"])
            for head in HEADS}
    columns = [("learning rate", lambda lr: f"{lr:g}")]
    columns += [(HEAD_NAMES[head], (lambda h: lambda lr: _marked(by[(h, lr)], best[h]))(head)) for head in HEADS]
    table = common.markdown_table(rates, columns)
    for row in rows:
        row["head"] = HEAD_NAMES[row["classifier"]]
    common.plot_lines(os.path.join(args.out, "plot.png"), rows, x="learning_rate", series="head",
                      title=f"Class token vs GAP: micro ViT on the digits, {steps} steps",
                      xlabel="peak learning rate (AdamW)")
    settings = {"model": common.model_sizes(common.micro_model(args.quick, patch_size=7)) + ", no representation layer",
                "steps": steps, "learning_rates": list(rates), "seeds": args.seeds, "quick": args.quick,
                "test_examples": TEST_EXAMPLES,
                "recipe": "scratch: AdamW, wd 0.05, batch 128, 10% warmup + cosine, label smoothing 0.1, "
                          "no augmentation"}
    best_text = "; ".join(f"{HEAD_NAMES[h]} at lr {best[h]['learning_rate']:g} ({common.mean_std(best[h])})"
                          for h in HEADS)
    notes = (f"Best of each head (bold): {best_text}. The head is one linear layer (no representation layer) on "
             f"the class token's output or on the mean of the patch tokens.")
    return common.write_results(args.out, NAME, CLAIM, settings, rows, records, table, notes, started)


def _marked(row, best):
    text = common.mean_std(row)
    return f"**{text}**" if row is best else text


if __name__ == "__main__":
    main()
