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

from bench_core import MatmulProbe, _parse_case, alternate, macs_per_image  # noqa: E402
from decompose import add_step_arguments, append_line, model_runner  # noqa: E402


def gelu_runners(variant, size, batch, dtype, xla):
    """The GELU alone on (B, T, mlp), forward + backward: fused and plain."""
    import keras
    import tensorflow as tf

    from keras_vit.layers import fused
    from keras_vit.variants import get_variant

    c = get_variant(variant)
    x = tf.cast(tf.random.Generator.from_seed(0).normal((batch, (size // c.patch_size) ** 2 + 1, c.mlp_dim)), dtype)
    runners = {}
    for name, gelu in (("fused", fused.gelu), ("plain", keras.activations.gelu)):
        def grad(x, gelu=gelu):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.cast(gelu(x, approximate=True), "float32") * 0.5)
            return tape.gradient(loss, x)

        step = tf.function(grad, jit_compile=xla, autograph=False)
        runners[f"GELU {name}"] = (lambda step=step: step(x).numpy())
    return runners


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/fused_ab.py", description=__doc__.split("\n\n")[0])
    add_step_arguments(parser, "S/16@224", 16, "bfloat16", False)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    variant, size = _parse_case(args.case)
    runners = {f"gradient {name}": model_runner(variant, size, args.batch, args.dtype, True, args.xla, fused_gelu=on)
               for name, on in (("fused", True), ("plain", False))}
    runners.update(gelu_runners(variant, size, args.batch, args.dtype, args.xla))
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
    result["GELU_speedup"] = round(median["GELU plain"] / median["GELU fused"], 2)
    print(json.dumps(result))
    append_line(args.output, result)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
