"""`keras-vit bench`: keras-vit against keras-hub's ViT and HF transformers'
PyTorch ViT, side by side on this machine, each figure also a fraction of the
machine's matrix-multiply peak measured in the same run.

The machine is usually shared, so no figure is a single timing: every case
builds all its contenders, then runs them in alternating rounds (A, B, C,
matmul probe, A, B, C, probe, ...) and reports medians. Ratios between
contenders (and to the probe) come from the same rounds, which is what makes
them comparable when absolute numbers drift with the load.

Sections (`--sections`):
  inference  images/s for every (variant, image size, batch, dtype, impl)
  training   forward + backward + AdamW step images/s, both through `fit`
  tflite     batch-1 latency of float32 / float16 / dynamic-range int8 models
  memory     peak RSS of each inference contender, each in a fresh process

keras-hub and torch/transformers are optional (`pip install keras-hub`): a
missing one is reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

IMPLS = ("keras-vit", "keras-hub", "torch")
DTYPES = ("float32", "bfloat16")
SECTIONS = ("inference", "training", "tflite", "memory")
FULL_CASES = ("Ti/16@224", "S/16@224", "B/16@224", "B/16@384")
FULL_BATCHES = (1, 8, 32)
PROBE_SIZE = 2048  # the square matmul whose speed is taken as the limit


# --------------------------------------------------------------------------
# Work per image, from the variant table (nothing here repeats the sizes).
# --------------------------------------------------------------------------

def macs_per_image(variant: str, image_size: int) -> int:
    """Multiply-accumulates of one forward pass (ViT-B/16 at 224: 17.6 G).

    Patch embedding, then per block: q/k/v/out projections (4 N D^2), the two
    attention products (2 N^2 D) and the MLP (2 N D mlp). LayerNorm, softmax,
    GELU and the head are a fraction of a percent and left out.
    """
    from keras_vit.variants import get_variant

    c = get_variant(variant)
    patches = (image_size // c.patch_size) ** 2
    n = patches + 1  # class token
    d = c.hidden_size
    embed = patches * c.patch_size ** 2 * 3 * d
    block = 4 * n * d * d + 2 * n * n * d + 2 * n * d * c.mlp_dim
    return embed + c.num_layers * block


def _parse_case(text: str):
    variant, _, size = text.partition("@")
    return variant, int(size or 224)


# --------------------------------------------------------------------------
# Contenders: each is a name plus a zero-argument function that runs one batch
# to completion (results copied to host, so nothing is left queued).
# --------------------------------------------------------------------------

@contextlib.contextmanager
def _dtype_policy(dtype: str):
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16" if dtype == "bfloat16" else "float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _keras_vit_model(variant, image_size, dtype, include_top=False, num_classes=1000):
    import keras_vit

    with _dtype_policy(dtype):
        return keras_vit.ViT(variant, image_size=image_size, include_top=include_top, num_classes=num_classes)


def _keras_hub_backbone(variant, image_size, dtype):
    import keras_hub

    from keras_vit.variants import get_variant

    c = get_variant(variant)
    with _dtype_policy(dtype):
        return keras_hub.models.ViTBackbone(
            image_shape=(image_size, image_size, 3),
            patch_size=c.patch_size,
            num_layers=c.num_layers,
            num_heads=c.num_heads,
            hidden_dim=c.hidden_size,
            mlp_dim=c.mlp_dim,
        )


def _torch_model(variant, image_size, dtype):
    import torch
    import transformers

    from keras_vit.variants import get_variant

    c = get_variant(variant)
    config = transformers.ViTConfig(
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        intermediate_size=c.mlp_dim,
        image_size=image_size,
        patch_size=c.patch_size,
        layer_norm_eps=1e-6,
    )
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def inference_runner(impl: str, variant: str, image_size: int, batch: int, dtype: str, xla: bool) -> Callable:
    """A function that runs one forward pass of `batch` random images."""
    images = np.random.RandomState(0).uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    if impl == "torch":
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        model = _torch_model(variant, image_size, dtype)
        pixels = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())  # (B, C, H, W)
        if dtype == "bfloat16":
            pixels = pixels.to(torch.bfloat16)

        def run():
            with torch.inference_mode():
                return model(pixel_values=pixels).last_hidden_state.float().numpy()

        return run

    import tensorflow as tf

    model = (_keras_vit_model if impl == "keras-vit" else _keras_hub_backbone)(variant, image_size, dtype)
    forward = tf.function(lambda x: model(x, training=False), jit_compile=xla)
    x = tf.constant(images)
    return lambda: np.asarray(forward(x))


class MatmulProbe:
    """The machine's matmul speed, measured between the contenders' rounds.

    Both TF paths (oneDNN kernels and XLA) are probed and the faster taken, per
    dtype, so the limit is the best this TensorFlow can do on this CPU now.
    """

    def __init__(self, dtypes=DTYPES, size=PROBE_SIZE):
        import tensorflow as tf

        self.size = size
        self.runs = {}
        for dtype in dtypes:
            a = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)), dtype)
            for xla in (False, True):
                f = tf.function(lambda a: tf.reduce_sum(tf.cast(tf.matmul(a, a), "float32")), jit_compile=xla)
                self.runs[(dtype, xla)] = (lambda f=f, a=a: float(f(a)))
        self.samples: Dict[tuple, List[float]] = {k: [] for k in self.runs}
        for run in self.runs.values():
            run()

    def sample(self):
        for key, run in self.runs.items():
            start = time.perf_counter()
            run()
            self.samples[key].append(2 * self.size ** 3 / (time.perf_counter() - start) / 1e9)

    def peak(self, dtype) -> float:
        """GFLOP/s: median over samples, best of the two paths."""
        return max(statistics.median(v) for (d, _), v in self.samples.items() if d == dtype and v)

    def reset(self):
        self.samples = {k: [] for k in self.runs}

    def summary(self):
        return {
            f"{d}{'_xla' if x else ''}_gflops": round(statistics.median(v), 1)
            for (d, x), v in self.samples.items() if v
        }


def alternate(runners: Dict[str, Callable], rounds: int, block_seconds: float,
              probe: Optional[MatmulProbe] = None, warmup: int = 2) -> Dict[str, float]:
    """Median seconds per call of each runner, timed in alternating rounds.

    Each round times a block of calls per runner (enough calls to last about
    `block_seconds`, judged from the warm-up) and then samples the probe.
    """
    calls = {}
    for name, run in runners.items():
        for _ in range(max(warmup - 1, 0)):
            run()  # compilation, allocation
        start = time.perf_counter()
        run()
        calls[name] = max(1, int(block_seconds / max(time.perf_counter() - start, 1e-6)))
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                run()
            times[name].append((time.perf_counter() - start) / calls[name])
        if probe is not None:
            probe.sample()
    return {name: statistics.median(v) for name, v in times.items()}


# --------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------

@dataclass
class Contender:
    impl: str
    dtype: str
    xla: bool

    @property
    def label(self):
        path = "" if self.impl == "torch" else (" XLA" if self.xla else " no-XLA")
        return f"{self.impl} {self.dtype}{path}"


def inference_contenders(impls, dtypes) -> List[Contender]:
    """Both Keras models on both TF paths (XLA, and TF's graph executor with
    oneDNN kernels, which wins for bfloat16 on CPU); torch eager."""
    out = []
    for dtype in dtypes:
        for impl in ("keras-vit", "keras-hub"):
            if impl in impls:
                out += [Contender(impl, dtype, True), Contender(impl, dtype, False)]
        if "torch" in impls:
            out.append(Contender("torch", dtype, False))
    return out


def run_inference(args, probe, log) -> List[dict]:
    rows = []
    for case in args.cases:
        variant, size = _parse_case(case)
        flops = 2 * macs_per_image(variant, size)
        for batch in args.batches:
            runners, contenders = {}, {}
            for c in inference_contenders(args.impls, args.dtypes):
                try:
                    runners[c.label] = inference_runner(c.impl, variant, size, batch, c.dtype, c.xla)
                    contenders[c.label] = c
                except Exception as error:  # a peer that cannot build this case is reported, not fatal
                    log(f"  skip {c.label}: {type(error).__name__}: {error}")
            log(f"inference {variant}@{size} batch {batch}: {len(runners)} contenders")
            probe.reset()
            seconds = alternate(runners, args.rounds, args.block_seconds, probe)
            for label, s in seconds.items():
                c = contenders[label]
                peak = probe.peak(c.dtype)
                rows.append({
                    "variant": variant, "image_size": size, "batch": batch, **asdict(c), "label": label,
                    "images_per_s": batch / s, "gflops": batch * flops / s / 1e9,
                    "matmul_peak_gflops": peak, "fraction_of_peak": batch * flops / s / 1e9 / peak,
                    "probe": probe.summary(),
                })
                log(f"  {label:28s} {batch / s:8.2f} img/s  {rows[-1]['fraction_of_peak']:.0%} of {c.dtype} matmul peak")
            del runners
    return rows


def _training_model(impl, variant, size, dtype, xla, num_classes):
    import keras

    if impl == "keras-vit":
        model = _keras_vit_model(variant, size, dtype, include_top=True, num_classes=num_classes)
    else:
        backbone = _keras_hub_backbone(variant, size, dtype)
        images = keras.Input((size, size, 3))
        tokens = backbone(images)
        logits = keras.layers.Dense(num_classes, dtype="float32", name="head")(tokens[:, 0])
        model = keras.Model(images, logits)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=xla,
    )
    return model


def run_training(args, probe, log) -> List[dict]:
    """One optimizer step per batch through `fit` for both Keras models (same
    optimizer, loss, data held in memory so nothing waits on input)."""
    import tensorflow as tf

    variant, size = _parse_case(args.train_case)
    flops = 3 * 2 * macs_per_image(variant, size)  # backward costs about twice the forward
    batch, steps = args.train_batch, args.train_steps
    rng = np.random.RandomState(0)
    data = tf.data.Dataset.from_tensors((
        rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32"),
        rng.randint(0, 10, (batch,)).astype("int32"),
    )).repeat()
    runners, contenders = {}, {}
    for impl in [i for i in args.impls if i != "torch"]:
        # float32 on both TF paths; bfloat16 without XLA, whose CPU bf16 kernels are slower than oneDNN's.
        wanted = [("float32", True), ("bfloat16", False)] + ([] if args.quick else [("float32", False)])
        for dtype, xla in [(d, x) for d, x in wanted if d in args.dtypes]:
            c = Contender(impl, dtype, xla)
            try:
                model = _training_model(impl, variant, size, dtype, xla, 10)
            except Exception as error:
                log(f"  skip training {c.label}: {type(error).__name__}: {error}")
                continue
            runners[c.label] = lambda model=model: model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            contenders[c.label] = c
    log(f"training {variant}@{size} batch {batch}: {len(runners)} contenders")
    probe.reset()
    seconds = alternate(runners, args.rounds, args.block_seconds, probe, warmup=1)
    rows = []
    for label, s in seconds.items():
        c = contenders[label]
        per_step = s / steps
        peak = probe.peak(c.dtype)
        rows.append({
            "variant": variant, "image_size": size, "batch": batch, **asdict(c), "label": label + " fit",
            "images_per_s": batch / per_step, "gflops": batch * flops / per_step / 1e9,
            "matmul_peak_gflops": peak, "fraction_of_peak": batch * flops / per_step / 1e9 / peak,
        })
        log(f"  {label:28s} {batch / per_step:8.2f} img/s  {rows[-1]['fraction_of_peak']:.0%} of peak")
    return rows


def tflite_models(model, kinds) -> Dict[str, bytes]:
    """float32, float16-weight and dynamic-range int8 TFLite flatbuffers."""
    import tensorflow as tf

    out = {}
    for kind in kinds:
        # (from_concrete_functions would leave the weights out as variables.)
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        if kind in ("float16", "int8"):
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if kind == "float16":
            converter.target_spec.supported_types = [tf.float16]
        with contextlib.redirect_stdout(open(os.devnull, "w")):  # Keras lists every captured variable
            out[kind] = converter.convert()
    return out


def run_tflite(args, probe, log) -> List[dict]:
    from ai_edge_litert.interpreter import Interpreter

    variant, size = _parse_case(args.tflite_case)
    model = _keras_vit_model(variant, size, "float32", include_top=True)
    image = np.random.RandomState(0).uniform(-1, 1, (1, size, size, 3)).astype("float32")
    runners, sizes = {}, {}
    for kind, content in tflite_models(model, ("float32", "float16", "int8")).items():
        interpreter = Interpreter(model_content=content, num_threads=args.tflite_threads)
        interpreter.allocate_tensors()
        inp, out = interpreter.get_input_details()[0]["index"], interpreter.get_output_details()[0]["index"]

        def run(interpreter=interpreter, inp=inp, out=out):
            interpreter.set_tensor(inp, image)
            interpreter.invoke()
            return interpreter.get_tensor(out)

        runners[kind] = run
        sizes[kind] = len(content)
    log(f"tflite {variant}@{size} batch 1, {args.tflite_threads} threads")
    probe.reset()
    seconds = alternate(runners, args.rounds, args.block_seconds, probe)
    flops = 2 * macs_per_image(variant, size)
    rows = []
    for kind, s in seconds.items():
        rows.append({
            "variant": variant, "image_size": size, "kind": kind, "threads": args.tflite_threads,
            "latency_ms": 1000 * s, "megabytes": sizes[kind] / 2 ** 20,
            "speedup_vs_float32": seconds["float32"] / s,
            # int8 runs on integer units: its float32 fraction would be no limit at all
            "fraction_of_float32_peak": None if kind == "int8" else flops / s / 1e9 / probe.peak("float32"),
        })
        log(f"  {kind:8s} {1000 * s:8.1f} ms  {sizes[kind] / 2 ** 20:6.1f} MiB  x{rows[-1]['speedup_vs_float32']:.2f}")
    return rows


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def memory_child(spec: str):
    """In a fresh process: RSS after imports, then peak RSS over a few calls."""
    impl, dtype, xla, case, batch = spec.split(",")
    variant, size = _parse_case(case)
    import tensorflow  # noqa: F401  (every child pays the same imports)

    if impl == "torch":
        import torch  # noqa: F401
    before = _rss_mib()
    run = inference_runner(impl, variant, size, int(batch), dtype, xla == "1")
    for _ in range(3):
        run()
    # VmHWM, not ru_maxrss: the latter carries the parent's peak across exec.
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    print(json.dumps({"baseline_mib": before, "peak_mib": peak}))


def run_memory(args, log) -> List[dict]:
    variant, size = _parse_case(args.memory_case)
    rows = []
    for c in inference_contenders(args.impls, args.dtypes):
        spec = f"{c.impl},{c.dtype},{int(c.xla)},{variant}@{size},{args.memory_batch}"
        result = subprocess.run(
            [sys.executable, "-m", "keras_vit.bench", "--memory-child", spec],
            capture_output=True, text=True, timeout=900,
        )
        try:
            child = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            log(f"  memory {c.label}: failed: {result.stderr.strip().splitlines()[-1:]}")
            continue
        rows.append({
            "variant": variant, "image_size": size, "batch": args.memory_batch, **asdict(c), "label": c.label,
            "peak_rss_mib": child["peak_mib"], "model_and_activations_mib": child["peak_mib"] - child["baseline_mib"],
        })
        log(f"  memory {c.label:28s} peak {child['peak_mib']:7.0f} MiB  (+{rows[-1]['model_and_activations_mib']:.0f} over imports)")
    return rows


# --------------------------------------------------------------------------
# Machine, report
# --------------------------------------------------------------------------

def describe_machine() -> dict:
    import keras
    import tensorflow as tf

    cpu, flags = platform.processor(), []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not cpu.strip("x86_64 "):
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__}
    for name in ("keras_hub", "torch", "transformers", "ai_edge_litert"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "matrix_extensions": sorted(f for f in flags if f.startswith(("avx512_bf16", "amx", "avx512f", "avx_vnni"))),
        "gpu": [d.name for d in tf.config.list_physical_devices("GPU")] or "none",
        "load_average_at_start": os.getloadavg(),
        "versions": versions,
    }


def markdown(report) -> str:
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, GPU: {m['gpu']}; "
        f"load average at start {', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}. "
        f"Matmul peak in this run ({PROBE_SIZE}^3): {report.get('matmul_peak', {})} GFLOP/s.",
        "",
    ]
    inference = report.get("inference", [])
    if inference:
        lines += ["| model | batch | implementation | images/s | vs keras-hub f32 XLA | vs torch f32 | of matmul peak |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for row in inference:
            same = [r for r in inference if (r["variant"], r["image_size"], r["batch"]) ==
                    (row["variant"], row["image_size"], row["batch"])]
            hub = next((r for r in same if r["label"] == "keras-hub float32 XLA"), None)
            torch = next((r for r in same if r["label"] == "torch float32"), None)
            lines.append(
                f"| {row['variant']}@{row['image_size']} | {row['batch']} | {row['label']} | {row['images_per_s']:.2f} | "
                f"{_ratio(row, hub)} | {_ratio(row, torch)} | {row['fraction_of_peak']:.0%} |"
            )
        lines.append("")
    training = report.get("training", [])
    if training:
        lines += ["| training step | batch | implementation | images/s | vs keras-hub f32 fit | of matmul peak |",
                  "|---|---:|---|---:|---:|---:|"]
        hub = next((r for r in training if r["label"] == "keras-hub float32 XLA fit"), None)
        for row in training:
            lines.append(f"| {row['variant']}@{row['image_size']} | {row['batch']} | {row['label']} | "
                         f"{row['images_per_s']:.2f} | {_ratio(row, hub)} | {row['fraction_of_peak']:.0%} |")
        lines.append("")
    tflite = report.get("tflite", [])
    if tflite:
        lines += ["| TFLite (keras-vit) | threads | kind | latency ms | MiB | speed vs float32 | of f32 matmul peak |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for row in tflite:
            lines.append(f"| {row['variant']}@{row['image_size']} | {row['threads']} | {row['kind']} | "
                         f"{row['latency_ms']:.1f} | {row['megabytes']:.0f} | {row['speedup_vs_float32']:.2f}x | "
                         f"{_percent(row['fraction_of_float32_peak'])} |")
        lines.append("")
    memory = report.get("memory", [])
    if memory:
        lines += ["| peak memory | batch | implementation | peak RSS MiB | over imports MiB |", "|---|---:|---|---:|---:|"]
        for row in memory:
            lines.append(f"| {row['variant']}@{row['image_size']} | {row['batch']} | {row['label']} | "
                         f"{row['peak_rss_mib']:.0f} | {row['model_and_activations_mib']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def _percent(fraction):
    return "-" if fraction is None else f"{fraction:.0%}"


def _ratio(row, reference):
    return f"{row['images_per_s'] / reference['images_per_s']:.2f}x" if reference else "-"


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--quick", action="store_true",
                        help="B/16 at 224, batch 8, 3 rounds, training on float32 XLA and bfloat16 only")
    parser.add_argument("--cases", nargs="+", default=list(FULL_CASES), metavar="VARIANT@SIZE",
                        help=f"inference models (default: {' '.join(FULL_CASES)})")
    parser.add_argument("--batches", nargs="+", type=int, default=list(FULL_BATCHES))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--rounds", type=int, default=5, help="alternating repetitions; medians are reported")
    parser.add_argument("--block-seconds", type=float, default=2.0,
                        help="each contender runs about this long per round")
    parser.add_argument("--train-case", default="B/16@224")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=2, help="optimizer steps per fit call")
    parser.add_argument("--tflite-case", default="B/16@224")
    parser.add_argument("--tflite-threads", type=int, default=2)
    parser.add_argument("--memory-case", default="B/16@224")
    parser.add_argument("--memory-batch", type=int, default=8)
    parser.add_argument("--output", default="bench.json", help="JSON results")
    parser.add_argument("--markdown", default=None, help="also write the tables to this file")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)


def run(args):
    if args.memory_child:
        return memory_child(args.memory_child)
    if args.quick:
        args.cases, args.batches, args.rounds = ["B/16@224"], [8], min(args.rounds, 3)
        args.block_seconds = min(args.block_seconds, 1.0)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    available = []
    for impl in args.impls:
        module = {"keras-vit": "keras_vit", "keras-hub": "keras_hub", "torch": "transformers"}[impl]
        try:
            __import__(module)
            available.append(impl)
        except ImportError as error:
            print(f"keras-vit bench: {impl} not installed ({error}); skipped", file=sys.stderr)
    args.impls = available

    def log(message):
        print(message, flush=True)

    report = {"machine": describe_machine(), "arguments": {k: v for k, v in vars(args).items() if k != "memory_child"}}
    log(json.dumps(report["machine"]))
    started = time.time()
    probe = MatmulProbe(args.dtypes)
    probe.sample()
    sections = {
        "inference": lambda: run_inference(args, probe, log),
        "training": lambda: run_training(args, probe, log),
        "tflite": lambda: run_tflite(args, probe, log),
        "memory": lambda: run_memory(args, log),
    }
    all_probes = {k: [] for k in probe.samples}
    for name in [s for s in SECTIONS if s in args.sections]:
        report[name] = sections[name]()
        for k, v in probe.samples.items():
            all_probes[k] += v
        _write(args.output, report, all_probes, started)  # partial results survive an interrupted run
    report = _write(args.output, report, all_probes, started)
    print()
    print(markdown(report))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
    return 0


def _write(path, report, probes, started):
    report["matmul_peak"] = {
        f"{d}{' XLA' if x else ''}": round(statistics.median(v), 1) for (d, x), v in probes.items() if v
    }
    report["seconds"] = round(time.time() - started)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=float)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m keras_vit.bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()) or 0)
