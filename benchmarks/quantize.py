"""float32 against int8 and int4 (#39): file size, memory and CPU latency of one model.

    python benchmarks/quantize.py [--model B/16] [--size 224] [--runs 20]

The parent builds the model (random weights, seeded), saves it as .keras and quantises it
with keras_vit.quantize to int8 and int4 (.keras each). Each file is then loaded in a fresh
process, which reports the RSS the load added (VmRSS before and after) and its peak (VmHWM), the weights' bytes in memory, and the latency of a traced call (tf.function, no XLA)
at batch 1 and 8: the median of `--runs` calls after two warm-up calls, TensorFlow's default
threads. Writes benchmarks/results_quantize.{json,md}.
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
    """One file, in this process: -> its figures."""
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit.model.quantization import weight_bytes

    before = fresh.status_mib("VmRSS")
    model = keras_vit.load_model(spec["path"])
    loaded = fresh.status_mib("VmRSS")
    call = tf.function(lambda x: model(x, training=False))
    latency = {}
    for batch in (1, 8):
        images = tf.constant(np.random.default_rng(0).uniform(-1, 1, (batch, spec["size"], spec["size"], 3)),
                             tf.float32)
        for _ in range(2):
            call(images).numpy()
        times = []
        for _ in range(spec["runs"]):
            start = time.perf_counter()
            call(images).numpy()
            times.append(time.perf_counter() - start)
        latency[batch] = statistics.median(times) * 1000
    return {"mode": spec["mode"], "file_mib": os.path.getsize(spec["path"]) / 2**20,
            "weights_mib": weight_bytes(model) / 2**20, "load_rss_mib": loaded - before,
            "peak_rss_mib": fresh.status_mib("VmHWM"), "latency_ms_b1": latency[1], "latency_ms_b8": latency[8]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    import keras

    import keras_vit

    scratch = tempfile.mkdtemp(prefix="quantize_bench_")
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(args.model, image_size=args.size, num_classes=1000)
    paths = {"float32": os.path.join(scratch, "float32.keras")}
    model.save(paths["float32"])
    seconds = {}
    for mode in ("int8", "int4"):
        start = time.perf_counter()
        keras_vit.quantize(model, mode).save(os.path.join(scratch, f"{mode}.keras"))
        seconds[mode] = time.perf_counter() - start
        paths[mode] = os.path.join(scratch, f"{mode}.keras")
    rows = []
    for mode, path in paths.items():
        rows.append({**fresh.run_child(__file__, dict(mode=mode, path=path, size=args.size, runs=args.runs)),
                     "quantize_and_save_s": seconds.get(mode)})
        print(rows[-1], flush=True)
    machine = fresh.machine()
    with open(os.path.join(HERE, "results_quantize.json"), "w") as f:
        json.dump({"machine": machine, "model": args.model, "image_size": args.size, "rows": rows}, f, indent=1)
    base = rows[0]
    lines = [f"{args.model} at {args.size} px, 1000 classes, traced call without XLA, median of {args.runs}; "
             f"{machine['cpu']}, {machine['cores']} cores, {machine['date']}.",
             "", "| weights | model.keras MiB | weights in memory MiB | RSS the load added MiB | peak RSS MiB | "
                 "batch 1 ms | batch 8 ms | quantise + save s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        made = "-" if row["quantize_and_save_s"] is None else f"{row['quantize_and_save_s']:.1f}"
        lines.append(f"| {row['mode']} | {row['file_mib']:.0f} ({row['file_mib'] / base['file_mib']:.2f}x) | "
                     f"{row['weights_mib']:.0f} ({row['weights_mib'] / base['weights_mib']:.2f}x) | "
                     f"{row['load_rss_mib']:.0f} | {row['peak_rss_mib']:.0f} | {row['latency_ms_b1']:.0f} "
                     f"({row['latency_ms_b1'] / base['latency_ms_b1']:.2f}x) | {row['latency_ms_b8']:.0f} "
                     f"({row['latency_ms_b8'] / base['latency_ms_b8']:.2f}x) | {made} |")
    with open(os.path.join(HERE, "results_quantize.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
