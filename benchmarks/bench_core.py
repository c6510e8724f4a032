"""Shared by every section of benchmarks/bench.py: work per image, the
contenders and their model builders, the matmul probe, alternating rounds;
and the inference section."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

IMPLS = ("keras-vit", "keras-hub", "torch")
DTYPES = ("float32", "bfloat16")
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


def attention_share(variant: str, image_size: int) -> float:
    """The attention products' share (2 N^2 D per block) of macs_per_image:
    quadratic in the token count, so it grows with resolution (S/16: 8% at
    224, 20% at 384)."""
    from keras_vit.variants import get_variant

    c = get_variant(variant)
    n = (image_size // c.patch_size) ** 2 + 1
    return c.num_layers * 2 * n * n * c.hidden_size / macs_per_image(variant, image_size)


def _parse_case(text: str):
    variant, _, size = text.partition("@")
    return variant, int(size or 224)


# --------------------------------------------------------------------------
# Contenders: each is a name plus a zero-argument function that runs one batch
# (or one optimizer step) to completion, results copied to host so nothing is
# left queued.
# --------------------------------------------------------------------------

@contextlib.contextmanager
def _dtype_policy(dtype: str):
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(_keras_policy(dtype))
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _keras_policy(dtype):
    return "mixed_bfloat16" if dtype == "bfloat16" else "float32"


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


def _torch_config(variant, image_size, **extra):
    import transformers

    from keras_vit.variants import get_variant

    c = get_variant(variant)
    return transformers.ViTConfig(
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        intermediate_size=c.mlp_dim,
        image_size=image_size,
        patch_size=c.patch_size,
        layer_norm_eps=1e-6,
        **extra,
    )


def _torch_model(variant, image_size, dtype):
    import torch
    import transformers

    model = transformers.ViTModel(_torch_config(variant, image_size), add_pooling_layer=False).eval()
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def _random_images(batch, image_size, seed=0):
    return np.random.RandomState(seed).uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")


def inference_runner(impl: str, variant: str, image_size: int, batch: int, dtype: str, xla: bool) -> Callable:
    """A function that runs one forward pass of `batch` random images."""
    images = _random_images(batch, image_size)
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
              probe: Optional[MatmulProbe] = None, warmup: int = 2) -> Dict[str, List[float]]:
    """Seconds per call of each runner in each of `rounds` alternating rounds.

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
    return times


def _ratio_to(rounds: Dict[str, List[float]], label: str, reference: Optional[str]) -> Optional[float]:
    """How many times faster `label` ran than `reference`, from the medians of the same rounds."""
    if reference is None or reference not in rounds:
        return None
    return statistics.median(rounds[reference]) / statistics.median(rounds[label])


# --------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------

@dataclass
class Contender:
    impl: str
    dtype: str
    xla: bool
    path: str = ""  # training only: "train()" (the project's trainer) or "fit"

    @property
    def label(self):
        how = "" if self.impl == "torch" else (" XLA" if self.xla else " no-XLA")
        return f"{self.impl}{' ' + self.path if self.path else ''} {self.dtype}{how}"


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
            for c in _matching(inference_contenders(args.impls, args.dtypes), args.match):
                try:
                    runners[c.label] = inference_runner(c.impl, variant, size, batch, c.dtype, c.xla)
                    contenders[c.label] = c
                except Exception as error:  # a peer that cannot build this case is reported, not fatal
                    log(f"  skip {c.label}: {type(error).__name__}: {error}")
            log(f"inference {variant}@{size} batch {batch}: {len(runners)} contenders")
            probe.reset()
            rounds = alternate(runners, args.rounds, args.block_seconds, probe)
            for label, times in rounds.items():
                c = contenders[label]
                s = statistics.median(times)
                peak = probe.peak(c.dtype)
                rows.append({
                    "variant": variant, "image_size": size, "batch": batch, **asdict(c), "label": label,
                    "images_per_s": batch / s, "gflops": batch * flops / s / 1e9,
                    "matmul_peak_gflops": peak, "fraction_of_peak": batch * flops / s / 1e9 / peak,
                    "round_seconds": times,
                    "vs_keras_hub_float32_xla": _ratio_to(rounds, label, "keras-hub float32 XLA"),
                    "vs_torch_float32": _ratio_to(rounds, label, "torch float32"),
                    "probe": probe.summary(),
                })
                log(f"  {label:28s} {batch / s:8.2f} img/s  {rows[-1]['fraction_of_peak']:.0%} of {c.dtype} matmul peak")
            del runners
    return rows



def _matching(contenders, texts):
    """The contenders whose label contains one of `texts` (all when none given)."""
    return [c for c in contenders if not texts or any(t in c.label for t in texts)]


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
