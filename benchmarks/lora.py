"""Full fine-tuning against LoRA (#39): step time, peak memory and trainable weights, same batch.

    python benchmarks/lora.py [--model B/16] [--batch 8] [--ranks 4,8,16] [--steps 6]

Each configuration trains in a fresh process (its peak RSS is the process's own high-water
mark) from the same random official-format .npz of the model (LoRA needs weights to adapt;
full fine-tuning starts from the same ones), on random 224 px images of 10 classes, with
keras_vit.training.train and the finetune recipe (SGD with momentum, float32, XLA as the
trainer picks it). The step time is the median of the steps after the first two (the first
traces and compiles). Writes benchmarks/results_lora.{json,md} (results_lora_L16.{json,md} for
--model L/16: one file pair per model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # run as a script: its sibling modules
    sys.path.insert(0, HERE)

import fresh  # noqa: E402


def child(spec: dict) -> dict:
    """One configuration, in this process: -> its figures."""
    import numpy as np

    from keras_vit.training import TrainConfig, train

    stamps = []
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (spec["batch"] * 4, spec["size"], spec["size"], 3), dtype=np.uint8)
    labels = rng.integers(0, 10, len(images)).astype(np.int64)
    config = TrainConfig.create(
        "finetune", model=spec["model"], weights=spec["weights"], image_size=spec["size"], steps=spec["steps"],
        batch_size=spec["batch"], warmup_steps=0, eval_batch_size=spec["batch"], steps_per_loop=1, log_every=1,
        checkpoint_every=10_000, progress=False, strategy="default", workdir=spec["workdir"],
        lora_rank=spec["rank"])
    results = train(config, dataset=(images, labels), callbacks=[lambda step, logs: stamps.append(time.perf_counter())])
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    return {"rank": spec["rank"], "step_s": statistics.median(steps), "trainable": results["parameters"]["trainable"],
            "total": results["parameters"]["total"], "peak_rss_mib": fresh.status_mib("VmHWM"),
            "jit_compile": results["plan"]["jit_compile"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ranks", default="4,8,16")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    import keras

    import keras_vit

    scratch = tempfile.mkdtemp(prefix="lora_bench_")
    weights = os.path.join(scratch, "base.npz")
    keras.utils.set_random_seed(0)
    keras_vit.save_weights(keras_vit.ViT(args.model, image_size=args.size, num_classes=10), weights)
    rows = []
    for rank in [0] + [int(r) for r in args.ranks.split(",")]:
        spec = dict(model=args.model, size=args.size, batch=args.batch, steps=args.steps, rank=rank, weights=weights,
                    workdir=os.path.join(scratch, f"rank{rank}"))
        rows.append(fresh.run_child(__file__, spec))
        print(rows[-1], flush=True)
    machine = fresh.machine()
    stem = "results_lora" + ("" if args.model == "B/16" else "_" + args.model.replace("/", ""))
    with open(os.path.join(HERE, stem + ".json"), "w") as f:
        json.dump({"machine": machine, "model": args.model, "image_size": args.size, "batch": args.batch,
                   "rows": rows}, f, indent=1)
    full = rows[0]
    lines = [f"{args.model} at {args.size} px, batch {args.batch}, finetune recipe (SGD + momentum), float32, "
             f"{'XLA' if full['jit_compile'] else 'no XLA'}; {machine['cpu']}, {machine['cores']} cores, {machine['date']}.",
             "", "| run | trainable weights | of all | step s | step vs full | peak RSS MiB | memory vs full |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        name = "full fine-tuning" if not row["rank"] else f"LoRA r={row['rank']} (query, value)"
        lines.append(f"| {name} | {row['trainable']:,} | {row['trainable'] / row['total']:.2%} | {row['step_s']:.2f} | "
                     f"{row['step_s'] / full['step_s']:.2f}x | {row['peak_rss_mib']:.0f} | "
                     f"{row['peak_rss_mib'] / full['peak_rss_mib']:.2f}x |")
    with open(os.path.join(HERE, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
