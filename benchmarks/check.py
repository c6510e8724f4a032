"""The speed guard (`make bench-check`, not part of `make test`): the trainer against Keras `fit`
and keras_vit's inference against keras-hub's, paired per round, failing below a floor.

    python benchmarks/check.py                      # S/16 at 224, float32; exit 1 below 0.97x
    python benchmarks/check.py --case B/16@224 --floor 0.97

Pairs (each ratio: the peer's seconds over ours in the same round; the median over the rounds):

  train() / keras-vit fit     Trainer.run_loop(STEPS) on in-memory arrays against `fit` of the
                              same model on one in-memory batch, AdamW clipped to global norm 1.0
                              as the recipe's, XLA: the step alone
  train() / keras-hub fit     the same against keras-hub's ViTBackbone under a Dense head
  inference / keras-hub       one forward pass (XLA) of keras_vit's ViT against keras-hub's
  bf16 inference / keras-hub  the same under mixed_bfloat16, on a CPU with bfloat16 instructions
  bf16 train() / train()      on such a CPU, the trainer under mixed_bfloat16 (what --precision auto
                              picks there, oneDNN without XLA) against its float32 step: auto's choice
  bf16 train() / keras-hub    the same bf16 step against keras-hub's `fit` under mixed_bfloat16

The contenders alternate (A, B, C, matmul probe, A, ...) so that a shared machine's load falls on
all of them alike. The result is appended as one line to benchmarks/results_check.jsonl and
printed as the row docs/benchmarks.md keeps per machine ("The speed guard").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from bench_core import MatmulProbe, _parse_case, alternate, inference_runner  # noqa: E402
from bench_training import NUM_CLASSES, TrainerLoop, _fit_runner, trainer_config  # noqa: E402
from fresh import machine  # noqa: E402

from keras_vit.training.config import RECIPES  # noqa: E402
from keras_vit.training.strategies import cpu_bfloat16_extensions  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# `fit` clips the gradient to its global norm as the trainer's finetune recipe does, so that both make
# the same update: unclipped, fit would skip a pass over every gradient (about 1% of a B/16 step;
# results_check.jsonl's rows without "fit_clip_norm" were timed so).
CLIP = RECIPES["finetune"].grad_clip_norm


def runners(variant, size, batch, steps, scratch, bf16):
    """({name: a function that builds a call to time}, [(ours, peer)] the pairs to guard)."""
    import numpy as np

    arrays = (np.random.RandomState(0).randint(0, 256, (4 * batch, size, size, 3)).astype("uint8"),
              np.arange(4 * batch) % NUM_CLASSES)

    def trainer(dtype, xla, name):
        config = trainer_config("unused", os.path.join(scratch, name), variant, size, batch, dtype, xla,
                                steps_per_loop=steps).replace(train_augment="none")
        assert config.recipe.grad_clip_norm == CLIP
        return lambda: TrainerLoop(config, steps, dataset=arrays)

    found = {
        "train()": trainer("float32", True, "run"),
        "keras-vit fit": lambda: _fit_runner("keras-vit", variant, size, batch, "float32", True, steps, CLIP),
        "keras-hub fit": lambda: _fit_runner("keras-hub", variant, size, batch, "float32", True, steps, CLIP),
        "inference": lambda: inference_runner("keras-vit", variant, size, batch, "float32", True),
        "keras-hub inference": lambda: inference_runner("keras-hub", variant, size, batch, "float32", True),
    }
    pairs = [("train()", "keras-vit fit"), ("train()", "keras-hub fit"), ("inference", "keras-hub inference")]
    if bf16:
        found.update({
            "bf16 inference": lambda: inference_runner("keras-vit", variant, size, batch, "bfloat16", False),
            "keras-hub bf16 inference": lambda: inference_runner("keras-hub", variant, size, batch, "bfloat16", False),
            "bf16 train()": trainer("bfloat16", False, "run-bf16"),
            "keras-hub bf16 fit": lambda: _fit_runner("keras-hub", variant, size, batch, "bfloat16", False, steps,
                                                      CLIP),
        })
        pairs += [("bf16 inference", "keras-hub bf16 inference"), ("bf16 train()", "train()"),
                  ("bf16 train()", "keras-hub bf16 fit")]
    return found, pairs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="S/16@224", metavar="VARIANT@SIZE")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per call of train() and of fit")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--floor", type=float, default=0.97, help="fail when a pair's paired median is below it")
    parser.add_argument("--results", default=os.path.join(HERE, "results_check.jsonl"))
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="time only the pairs whose name holds TEXT (more rounds of one question)")
    args = parser.parse_args(argv)
    variant, size = _parse_case(args.case)
    scratch = tempfile.mkdtemp(prefix="keras-vit-check-")
    started = time.time()
    try:
        probe = MatmulProbe(["float32"])
        builders, pairs = runners(variant, size, args.batch, args.steps, scratch, bool(cpu_bfloat16_extensions()))
        pairs = [pair for pair in pairs if args.only in " / ".join(pair)]
        timed = {name for pair in pairs for name in pair}
        times = alternate({name: build() for name, build in builders.items() if name in timed}, args.rounds, 1.0,
                          probe, warmup=2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = {f"{ours} / {peer}": statistics.median(p / o for p, o in zip(times[peer], times[ours]))
              for ours, peer in pairs}
    # oneDNN held below the CPU's own instructions (ONEDNN_MAX_CPU_ISA=AVX2: a CPU without AVX-512).
    capped = {"onednn_max_cpu_isa": os.environ["ONEDNN_MAX_CPU_ISA"]} if os.environ.get("ONEDNN_MAX_CPU_ISA") else {}
    report = {**machine(), **capped, "time": time.strftime("%H:%M %Z"), "case": args.case, "batch": args.batch,
              "steps": args.steps, "fit_clip_norm": CLIP,
              "rounds": args.rounds, "probe_gflops": probe.summary(), "floor": args.floor,
              "seconds_per_call": {k: statistics.median(v) for k, v in times.items()}, "paired": ratios,
              "minutes": round((time.time() - started) / 60, 1)}
    with open(args.results, "a") as f:
        f.write(json.dumps(report) + "\n")
    failed = [name for name, ratio in ratios.items() if ratio < args.floor]
    for name, ratio in ratios.items():
        print(f"{name:46s} {ratio:.3f}x{'  BELOW ' + str(args.floor) if name in failed else ''}")
    print(f"docs/benchmarks.md row: | {report['date']} | {report['cpu']}, {report['cores']} cores"
          + (f", ONEDNN_MAX_CPU_ISA={capped['onednn_max_cpu_isa']}" if capped else "") + " | "
          f"{args.case} b{args.batch} | " + " | ".join(f"{r:.2f}x" for r in ratios.values()) + " |")
    if failed:
        print(f"bench-check: {', '.join(failed)} below {args.floor}x (paired medians of {args.rounds} rounds): "
              f"find the change that costs it before it lands (benchmarks/trainer_parts.py splits a step).",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
