"""The accelerator benchmark (#39): one command, under 8 minutes on a machine with a GPU.

    python benchmarks/gpu.py [--reduced] [--out DIR]

One fresh process per Keras backend (TensorFlow, JAX, PyTorch), each on the device that
backend finds (the GPU where there is one), the model a random ViT (keras_vit.ViT, the one
code for the three backends) under the mixed_bfloat16 policy:

  inference  images/s and MFU of the compiled forward pass (Keras' predict_on_batch,
             jit_compile="auto": XLA on TensorFlow, jax.jit on JAX, eager on PyTorch)
  training   images/s and MFU of one AdamW step (train_on_batch; 3x the forward FLOPs)
TensorFlow's process also measures (keras_vit's trainer is tf.distribute's):
  memory     the accelerator memory a training step takes: every weight training against
             LoRA rank 16 on query and value (keras_vit's LoRA), each model built after
             the allocator's peak was reset (None on a CPU: a process's high-water mark
             does not go down; benchmarks/lora.py measures the CPU in fresh processes)
  int8       batch-1 and batch-N latency of keras_vit.quantize(model, "int8") against
             the bfloat16 model
  trainer    keras_vit's own trainer (Trainer.run_loop on in-memory images, XLA) against Keras
             `fit` of the same model, AdamW, both mixed_bfloat16: images/s and their ratio

MFU: achieved FLOP/s over the device's dense bfloat16 peak (PEAK_BF16_TFLOPS, by device
name; None for a device not in the table, a CPU among them). FLOPs per image: 2x the
multiply-accumulates of benchmarks/bench_core.macs_per_image.

--reduced: Nano/4 at 16 px, batch 4, 1 timed call: the same code on the CPU in seconds
(tests/test_gpu_benchmark.py). Writes results_gpu.json and results_gpu.md to --out
(default: benchmarks/; the reduced form's default is a temporary folder).
"""

from __future__ import annotations

import argparse
import gc
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

BACKENDS = ("tensorflow", "jax", "torch")
# Dense bfloat16 peak of the accelerators this is likely to meet, TFLOP/s (vendors' data sheets, no sparsity).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0,
                    "A10": 125.0, "V100": 125.0, "T4": 65.0}
FULL = dict(model="B/16", size=224, batch=64, runs=10, lora_rank=16)
REDUCED = dict(model="Nano/4", size=16, batch=4, runs=1, lora_rank=4)


# --- in the child: one backend ------------------------------------------------------------------------------

def _device(backend: str) -> str:
    """The name of the device this backend computes on ("NVIDIA H100 80GB HBM3", or "cpu")."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return device.device_kind if device.platform != "cpu" else "cpu"
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "cpu"


def _timed(call, runs: int) -> float:
    """Median seconds of `call()` after two warm-up calls (the first compiles)."""
    call()
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _model(spec, **config):
    import keras_vit

    return keras_vit.ViT(spec["model"], image_size=spec["size"], num_classes=1000, **config)


def _data(spec, batch=None):
    import numpy as np

    rng = np.random.default_rng(0)
    batch = batch or spec["batch"]
    return (rng.uniform(-1, 1, (batch, spec["size"], spec["size"], 3)).astype("float32"),
            rng.integers(0, 1000, batch).astype("int32"))


def _compiled_for_training(model):
    import keras

    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile="auto")
    return model


def _training_memory(spec, lora_rank) -> dict:
    """TensorFlow on an accelerator: bytes a training step's model, optimizer state and
    activations take (the allocator's peak over what was in use before the model was built)."""
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    gc.collect()
    tf.config.experimental.reset_memory_stats("GPU:0")
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    model = _compiled_for_training(_model(spec, lora_rank=lora_rank))
    x, y = _data(spec)
    seconds = _timed(lambda: model.train_on_batch(x, y), spec["runs"])
    peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] - before
    trainable = int(sum(v.numpy().size for v in model.trainable_weights))
    return {"lora_rank": lora_rank, "peak_mib": peak / 2**20, "step_s": seconds, "trainable": trainable}


def _share_the_gpu(backend: str) -> None:
    """TensorFlow takes all of a GPU's memory when it first touches it: in TensorFlow's process
    it grows as needed instead, and in JAX's and PyTorch's it gets none (keras_vit may still use
    TensorFlow there, for data)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if backend != "tensorflow":
        tf.config.set_visible_devices([], "GPU")
    for gpu in gpus if backend == "tensorflow" else ():
        tf.config.experimental.set_memory_growth(gpu, True)


def child(spec: dict) -> dict:
    import keras

    _share_the_gpu(keras.backend.backend())
    keras.config.set_dtype_policy("mixed_bfloat16")
    from bench_core import macs_per_image

    backend = keras.backend.backend()
    device = _device(backend)
    flops = 2 * macs_per_image(spec["model"], spec["size"])
    peak = next((tflops * 1e12 for name, tflops in PEAK_BF16_TFLOPS.items() if name in device), None)
    x, y = _data(spec)
    model = _model(spec)
    model.compile(jit_compile="auto")
    forward = _timed(lambda: model.predict_on_batch(x), spec["runs"])
    _compiled_for_training(model)
    step = _timed(lambda: model.train_on_batch(x, y), spec["runs"])
    result = {"backend": backend, "device": device, "batch": spec["batch"],
              "inference_images_s": spec["batch"] / forward, "training_images_s": spec["batch"] / step,
              "inference_mfu": None if peak is None else spec["batch"] * flops / forward / peak,
              "training_mfu": None if peak is None else 3 * spec["batch"] * flops / step / peak}
    if backend == "tensorflow":
        result["int8"] = _int8_latency(spec, model)
        del model  # the memory section measures from what is in use without it
        result["trainer"] = _trainer_against_fit(spec)
        if device != "cpu":
            result["memory"] = [_training_memory(spec, rank) for rank in (0, spec["lora_rank"])]
    return result


def _trainer_against_fit(spec, steps=2) -> dict:
    """Images/s of keras_vit's trainer (`steps` optimizer steps per host call, in-memory images,
    XLA) and of Keras `fit` of the same model (the same steps per call), mixed_bfloat16, AdamW."""
    import numpy as np

    from bench_training import TrainerLoop, _fit_runner, trainer_config

    size, batch = spec["size"], spec["batch"]
    arrays = (np.random.default_rng(0).integers(0, 256, (4 * batch, size, size, 3)).astype("uint8"),
              np.arange(4 * batch) % 10)
    with tempfile.TemporaryDirectory() as scratch:
        config = trainer_config("unused", os.path.join(scratch, "run"), spec["model"], size, batch, "bfloat16", True,
                                steps_per_loop=steps).replace(train_augment="none")
        trainer = TrainerLoop(config, steps, dataset=arrays)
        fit = _fit_runner("keras-vit", spec["model"], size, batch, "bfloat16", True, steps)
        trainer_s, fit_s = _timed(trainer, spec["runs"]), _timed(fit, spec["runs"])
        trainer.close()
    return {"trainer_images_s": steps * batch / trainer_s, "fit_images_s": steps * batch / fit_s,
            "trainer_vs_fit": fit_s / trainer_s}


def _int8_latency(spec, model) -> dict:
    """Milliseconds of the bfloat16 model's forward pass and of its int8 copy's, at batch 1 and N."""
    import keras_vit

    quantized = keras_vit.quantize(model, "int8")
    quantized.compile(jit_compile="auto")
    model.compile(jit_compile="auto")
    latency = {}
    for name, batch in (("batch_1", 1), (f"batch_{spec['batch']}", spec["batch"])):
        images, _ = _data(spec, batch=batch)
        latency[name] = {"bfloat16_ms": 1000 * _timed(lambda: model.predict_on_batch(images), spec["runs"]),
                         "int8_ms": 1000 * _timed(lambda: quantized.predict_on_batch(images), spec["runs"])}
    return latency


# --- in the parent ------------------------------------------------------------------------------------------

def run_backend(backend: str, spec: dict) -> dict:
    env_backend = os.environ.get("KERAS_BACKEND")
    os.environ["KERAS_BACKEND"] = backend
    try:
        return fresh.run_child(__file__, spec)
    finally:
        if env_backend is None:
            os.environ.pop("KERAS_BACKEND")
        else:
            os.environ["KERAS_BACKEND"] = env_backend


def table(results: dict) -> str:
    spec = results["spec"]
    percent = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    lines = [f"{spec['model']} at {spec['size']} px, batch {spec['batch']}, mixed_bfloat16, median of {spec['runs']} "
             f"calls; {results['machine']['date']}.", "",
             "| backend | device | inference img/s | inference MFU | training img/s | training MFU |",
             "|---|---|---:|---:|---:|---:|"]
    for row in results["backends"]:
        lines.append(f"| {row['backend']} | {row['device']} | {row['inference_images_s']:.1f} | "
                     f"{percent(row['inference_mfu'])} | {row['training_images_s']:.1f} | {percent(row['training_mfu'])} |")
    tf_row = next((row for row in results["backends"] if row["backend"] == "tensorflow"), None)
    if tf_row is None:
        return "\n".join(lines) + "\n"
    lines += ["", "| TensorFlow | bfloat16 ms | int8 ms |", "|---|---:|---:|"]
    for name, row in tf_row["int8"].items():
        lines.append(f"| {name.replace('_', ' ')} | {row['bfloat16_ms']:.1f} | {row['int8_ms']:.1f} |")
    if tf_row.get("trainer"):
        row = tf_row["trainer"]
        lines += ["", "| TensorFlow training step | images/s |", "|---|---:|",
                  f"| keras_vit trainer (run_loop, XLA) | {row['trainer_images_s']:.1f} |",
                  f"| Keras `fit`, same model | {row['fit_images_s']:.1f} |",
                  f"| trainer / fit | {row['trainer_vs_fit']:.2f}x |"]
    if tf_row.get("memory"):
        lines += ["", "| TensorFlow training | trainable weights | step memory MiB | step s |", "|---|---:|---:|---:|"]
        for row in tf_row["memory"]:
            name = f"LoRA r={row['lora_rank']} (query, value)" if row["lora_rank"] else "every weight"
            lines.append(f"| {name} | {row['trainable']:,} | {row['peak_mib']:.0f} | {row['step_s']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="Nano/4 at 16 px, batch 4: the same code in seconds")
    parser.add_argument("--out", help="where results_gpu.{json,md} go (default: benchmarks/, or a temporary "
                                      "folder with --reduced)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, out of " + ",".join(BACKENDS))
    parser.add_argument("--child")
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return None
    spec = dict(REDUCED if args.reduced else FULL)
    out = args.out or (tempfile.mkdtemp(prefix="gpu_bench_") if args.reduced else HERE)
    started = time.perf_counter()
    rows = []
    for backend in args.backends.split(","):
        rows.append(run_backend(backend, spec))
        print(json.dumps(rows[-1]), flush=True)
    results = {"spec": spec, "machine": fresh.machine(), "seconds": time.perf_counter() - started, "backends": rows}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results_gpu.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "results_gpu.md"), "w") as f:
        f.write(table(results))
    print(table(results) + f"\n{results['seconds']:.0f} s in all; written to {out}")
    return results


if __name__ == "__main__":
    main()
