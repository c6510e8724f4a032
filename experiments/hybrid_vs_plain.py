"""ResNet+ViT hybrid vs plain ViT against training compute (the paper's Section 4.4, Figure 5), in miniature.

    python experiments/hybrid_vs_plain.py [--quick] [--seeds N] [--out DIR]

The paper: "hybrids slightly outperform ViT at small computational budgets,
but the difference vanishes for larger models" (R50+ViT vs ViT, pre-trained on
JFT-300M, transfer accuracy against pre-training FLOPs). Here: at three
training budgets (steps), from scratch on the bundled digits scaled to
32 x 32, the micro ViT (the Mu row at half width: 64 wide, 4 blocks, 4 heads) on 8 x 8 patches
against the same Transformer on the feature map of a BiT ResNet root block
(7 x 7 conv, stride 2, GroupNorm, max-pool, stride 2: ResNetConfig(num_layers=()),
what R+Ti/16 uses) cut into 2 x 2 patches: both see a 4 x 4 grid of tokens,
each of 8 x 8 pixels, so they differ by the convolutional stem alone. The
compute axis counts the FLOPs of the convolutions and matmuls of each step
(experiments.common.forward_flops, x3 for the backward pass).

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

NAME = "hybrid_vs_plain"
CLAIM = ("Hybrids slightly outperform ViT at small computational budgets, but the difference vanishes for "
         "larger ones (Section 4.4, Figure 5).")
BUDGETS, QUICK_BUDGETS = (80, 250, 800), (2, 4)
IMAGE_SIZE, BATCH = 32, 128
TEST_EXAMPLES = 1000
ARCHITECTURES = ("vit", "hybrid")
ARCHITECTURE_NAMES = {"vit": "ViT, 8x8 patches", "hybrid": "hybrid: ResNet root + 2x2 patches"}


def architecture(name, quick=False):
    from keras_vit.config import ResNetConfig
    mu = common.micro_model(quick)
    if name == "vit":
        return mu.replace(patch_size=8)
    return mu.replace(patch_size=2, resnet=ResNetConfig(num_layers=()))


def main(argv=None):
    args = common.parse_args(NAME, __doc__.splitlines()[0], argv)
    started = time.time()
    budgets = QUICK_BUDGETS if args.quick else BUDGETS
    arms = [{"architecture": arch, "steps": steps} for steps in budgets for arch in ARCHITECTURES]
    step_flops = {arch: 3 * BATCH * common.forward_flops(architecture(arch, args.quick), (IMAGE_SIZE, IMAGE_SIZE),
                                                         1)
                  for arch in ARCHITECTURES}

    def run(arm, seed, workdir):
        return common.train_run(workdir, architecture(arm["architecture"], args.quick), seed, arm["steps"],
                                args.quick, image_size=IMAGE_SIZE, batch_size=BATCH)

    records = common.run_grid(arms, args.seeds, args.runs, run)
    for record in records:
        record["train_tflops"] = step_flops[record["architecture"]] * record["steps"] / 1e12
    rows = common.summarise(records, ("architecture", "steps"), extra=("train_tflops", "images_per_sec", "params"))
    for row in rows:
        row["arm"] = ARCHITECTURE_NAMES[row["architecture"]]
    by = {(r["architecture"], r["steps"]): r for r in rows}

    def gap(steps):
        return f"{100 * (by[('hybrid', steps)]['accuracy_mean'] - by[('vit', steps)]['accuracy_mean']):+.2f}"

    columns = [("steps", lambda s: s)]
    for arch in ARCHITECTURES:
        columns += [(f"{ARCHITECTURE_NAMES[arch]}", (lambda a: lambda s: common.mean_std(by[(a, s)]))(arch)),
                    (f"TFLOPs ({arch})", (lambda a: lambda s: f"{by[(a, s)]['train_tflops']:.2f}")(arch))]
    columns += [("hybrid - ViT (points)", gap)]
    table = common.markdown_table(budgets, columns)
    common.plot_lines(os.path.join(args.out, "plot.png"), rows, x="train_tflops", series="arm",
                      title="Hybrid vs plain ViT on the digits (32 x 32), equal steps",
                      xlabel="training compute (TFLOPs, convolutions + matmuls)")
    params = {arch: next(r["params"] for r in rows if r["architecture"] == arch) for arch in ARCHITECTURES}
    settings = {"architectures": {a: ARCHITECTURE_NAMES[a] for a in ARCHITECTURES}, "budgets": list(budgets),
                "image_size": IMAGE_SIZE, "batch_size": BATCH, "seeds": args.seeds, "quick": args.quick,
                "test_examples": TEST_EXAMPLES, "params": params,
                "forward_flops_per_image": {a: step_flops[a] // (3 * BATCH) for a in ARCHITECTURES},
                "recipe": "scratch: AdamW lr 2e-3, wd 0.05, batch 128, 10% warmup + cosine, label smoothing 0.1, "
                          "GAP, no augmentation"}
    ratio = _time_ratio(rows)
    notes = (f"The same Transformer in both (width {architecture('vit').hidden_size}, GAP head); parameters: ViT {params['vit']:,}, hybrid {params['hybrid']:,}. "
             f"One training step costs {step_flops['vit'] / 1e9:.1f} GFLOPs (ViT) and "
             f"{step_flops['hybrid'] / 1e9:.1f} GFLOPs (hybrid) at batch {BATCH}"
             + (f"; on this CPU a hybrid step took {ratio:.1f}x the time of a ViT step (the stem's convolutions "
                f"and GroupNorm run at 16 x 16 x 64)." if ratio else "."))
    return common.write_results(args.out, NAME, CLAIM, settings, rows, records, table, notes, started)


def _time_ratio(rows):
    """Training images/s of the ViT over the hybrid's (the trainer times the steps
    after the first), or None when a run had too few steps to time."""
    speed = {}
    for arch in ARCHITECTURES:
        values = [r["images_per_sec"] for r in rows if r["architecture"] == arch and r["images_per_sec"]]
        if not values:
            return None
        speed[arch] = sum(values) / len(values)
    return speed["vit"] / speed["hybrid"]


if __name__ == "__main__":
    main()
