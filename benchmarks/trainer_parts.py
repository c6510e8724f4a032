"""Where a step of the project's trainer goes against Keras `fit`, in alternating rounds.

    python benchmarks/trainer_parts.py --case S/16@224 --batch 16 --rounds 8 --output benchmarks/results_trainer_parts.json

Seconds per optimizer step (medians over the same rounds, float32, XLA) of:

  fit                 keras-vit's ViT in Keras `fit` (bench.py's "keras-vit fit")
  run_loop jpeg       Trainer.run_loop(10) on a JPEG folder (bench.py's "train() loop 10")
  run_loop memory     Trainer.run_loop(10) on in-memory 224x224 arrays, no augmentation:
                      the same loop without JPEG decoding and cropping beside it
  local_gradients     trainer.compiled.local_gradients(batch) alone (forward, loss and
                      metrics, backward; XLA), one fixed batch
  update              the trainer's update alone (global-norm clipping, AdamW; XLA), fixed grads
  whole step          local_gradients then update as ONE XLA program (what
                      steps.whole_step is since f3a1a61), one fixed batch
  keras gradient      the same model's gradient with fit's loss (no metrics), XLA
  keras AdamW apply   fit's optimizer applying fixed gradients, XLA

so that  run_loop - (local_gradients + update)  is the loop's own cost (input,
while loop, strategy.run, host read),  local_gradients - keras gradient
what the trainer's loss and metrics add, and  whole step - (local_gradients +
update)  what splitting the step in two XLA programs costs. The fixed-batch
parts run inside trainer.strategy.run, as in the loop. Runs the keras_vit of
the checkout this file belongs to.
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

from bench_core import MatmulProbe, _keras_vit_model, _parse_case, _random_images, alternate  # noqa: E402
from bench_training import TrainerLoop, _fit_runner, trainer_config, write_jpeg_folder  # noqa: E402
from decompose import model_runner  # noqa: E402


def parts(variant, size, batch, scratch, fit_steps=2, loop=10):
    """{name: (run, steps per call)}."""
    import keras
    import numpy as np
    import tensorflow as tf

    data = write_jpeg_folder(os.path.join(scratch, "data"), size, count=max(64, 2 * batch))
    config = lambda run: trainer_config(data, os.path.join(scratch, run), variant, size, batch,  # noqa: E731
                                              "float32", True, steps_per_loop=loop)
    jpeg = TrainerLoop(config("jpeg"), loop)
    arrays = (np.random.RandomState(0).randint(0, 256, (4 * batch, size, size, 3)).astype("uint8"),
              np.arange(4 * batch) % 10)
    memory = TrainerLoop(config("memory").replace(train_augment="none"), loop, dataset=arrays)

    steps = jpeg.trainer.compiled
    batch_ = {"image": tf.constant(_random_images(batch, size)), "label": tf.constant(np.arange(batch) % 10, tf.int32),
              "weight": tf.ones((batch,))}
    strategy = jpeg.trainer.strategy
    compiled_update = getattr(steps, "update", None)  # before f3a1a61 the trainer compiled it itself
    compiled_update = compiled_update or tf.function(steps._update, jit_compile=True, autograph=False)
    whole = tf.function(lambda b: steps._update(steps._local_gradients(b)[0]), jit_compile=True, autograph=False)
    grads = strategy.experimental_local_results(strategy.run(steps.local_gradients, args=(batch_,)))[0][0]

    def on_replica(function, *args):
        result = strategy.experimental_local_results(strategy.run(function, args=args))[0]
        return float(tf.nest.flatten(result)[-1])  # a scalar figure: the program has finished

    model = _keras_vit_model(variant, size, "float32", include_top=True, num_classes=10)
    optimizer = keras.optimizers.AdamW(1e-4, weight_decay=1e-4)
    optimizer.build(model.trainable_variables)
    fixed = [tf.constant(0.01 * np.ones(v.shape, "float32")) for v in model.trainable_variables]
    apply = tf.function(lambda g: optimizer.apply(g, model.trainable_variables), jit_compile=True, autograph=False)

    return {
        "fit": (_fit_runner("keras-vit", variant, size, batch, "float32", True, fit_steps), fit_steps),
        f"run_loop({loop}) jpeg": (jpeg, loop),
        f"run_loop({loop}) memory": (memory, loop),
        "local_gradients": (lambda: on_replica(steps.local_gradients, batch_), 1),
        "update": (lambda: on_replica(compiled_update, grads), 1),
        "whole step": (lambda: on_replica(whole, batch_), 1),
        "keras gradient": (model_runner(variant, size, batch, "float32", True, True), 1),
        "keras AdamW apply": (lambda: (apply(fixed), float(optimizer.iterations))[1], 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="S/16@224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-seconds", type=float, default=1.0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    variant, size = _parse_case(args.case)
    scratch = tempfile.mkdtemp(prefix="keras-vit-parts-")
    try:
        probe = MatmulProbe(["float32"])
        found = parts(variant, size, args.batch, scratch)
        runners = {k: run for k, (run, _) in found.items()}
        times = alternate(runners, args.rounds, args.block_seconds, probe, warmup=2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    per_step = {k: [t / found[k][1] for t in v] for k, v in times.items()}
    medians = {k: statistics.median(v) for k, v in per_step.items()}
    fit = per_step["fit"]
    report = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "case": args.case, "batch": args.batch,
              "rounds": args.rounds, "probe_float32_gflops": probe.summary(), "seconds_per_step": medians,
              "rounds_seconds_per_step": per_step,
              "vs_fit_same_round": {k: statistics.median([f / x for f, x in zip(fit, v)]) for k, v in per_step.items()}}
    for k, s in medians.items():
        print(f"{k:24s} {1000 * s:9.1f} ms/step  {args.batch / s:7.2f} img/s  fit/this (paired median) "
              f"{report['vs_fit_same_round'][k]:.3f}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
