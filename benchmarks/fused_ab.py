"""The fused GELU (keras_vit.layers.fused, MlpBlock.fused_gelu) on and off,
in alternating rounds: the model's gradient computation (forward, loss,
backward) and the GELU alone at the model's shapes.

    python benchmarks/fused_ab.py --case S/16@224 --batch 16 --dtype bfloat16 --no-xla

"plain" is keras.activations.gelu; "fused" is what `keras-vit train` runs
when its step is not XLA-compiled (mixed_bfloat16 on a CPU, or --no-jit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import MatmulProbe, _keras_vit_model, _parse_case, _random_images, alternate, macs_per_image  # noqa: E402


def gradient_runner(on, variant, size, batch, dtype, xla):
    import numpy as np
    import tensorflow as tf

    from keras_vit.model import fuse_gelu

    model = _keras_vit_model(variant, size, dtype, include_top=True, num_classes=10)
    fuse_gelu(model, on)
    images = tf.constant(_random_images(batch, size))
    labels = tf.constant(np.arange(batch) % 10)

    def gradients(x):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        return tf.add_n([tf.reduce_sum(tf.cast(g, "float32")) for g in tape.gradient(loss, model.trainable_variables)])

    step = tf.function(gradients, jit_compile=xla, autograph=False)
    return lambda: float(step(images))


def piece_runners(variant, size, batch, dtype, xla):
    """The GELU alone on (B, T, mlp), forward + backward."""
    import keras
    import tensorflow as tf

    from keras_vit.layers import fused
    from keras_vit.variants import get_variant

    c = get_variant(variant)
    tokens = (size // c.patch_size) ** 2 + 1
    rng = tf.random.Generator.from_seed(0)
    pieces = {
        "GELU": ((batch, tokens, c.mlp_dim), lambda v, on: (fused.gelu(v, True) if on
                                                            else keras.activations.gelu(v, approximate=True))),
    }
    runners = {}
    for name, (shape, fn) in pieces.items():
        x = tf.cast(rng.normal(shape), dtype)
        for on in (True, False):
            def grad(x, fn=fn, on=on):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(tf.cast(fn(x, on), "float32") * 0.5)
                return tape.gradient(loss, x)

            step = tf.function(grad, jit_compile=xla, autograph=False)
            runners[f"{name} {'fused' if on else 'plain'}"] = (lambda step=step, x=x: step(x).numpy())
    return runners


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/fused_ab.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="S/16@224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    xla = parser.add_mutually_exclusive_group()
    xla.add_argument("--xla", dest="xla", action="store_true", default=False)
    xla.add_argument("--no-xla", dest="xla", action="store_false")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=2.0)
    parser.add_argument("--output", help="append the result as one JSON line to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    variant, size = _parse_case(args.case)
    runners = {"gradient fused": gradient_runner(True, variant, size, args.batch, args.dtype, args.xla),
               "gradient plain": gradient_runner(False, variant, size, args.batch, args.dtype, args.xla)}
    runners.update(piece_runners(variant, size, args.batch, args.dtype, args.xla))
    probe = MatmulProbe([args.dtype])
    probe.sample()
    times = alternate(runners, args.rounds, args.block_seconds, probe)
    median = {k: statistics.median(v) for k, v in times.items()}
    flops = 3 * 2 * macs_per_image(variant, size) * args.batch
    peak = probe.peak(args.dtype)
    result = {"variant": variant, "image_size": size, "batch": args.batch, "dtype": args.dtype, "xla": args.xla,
              "probe_gflops": round(peak, 1), "ms": {k: round(v * 1e3, 2) for k, v in median.items()},
              "gradient_speedup": round(median["gradient plain"] / median["gradient fused"], 3),
              "gradient_fused_of_probe": round(flops / median["gradient fused"] / 1e9 / peak, 3),
              "gradient_plain_of_probe": round(flops / median["gradient plain"] / 1e9 / peak, 3)}
    for name in ("GELU",):
        result[f"{name}_speedup"] = round(median[f"{name} plain"] / median[f"{name} fused"], 2)
    print(json.dumps(result))
    if args.output:
        with open(args.output, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
