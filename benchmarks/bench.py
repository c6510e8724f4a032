"""keras-vit against keras-hub's ViT and HF transformers' PyTorch ViT, side by
side on this machine, each figure also a fraction of the machine's
matrix-multiply peak measured in the same run.

Run it from a checkout of the repository (it is not part of the package):

    python benchmarks/bench.py --quick          # or: keras-vit bench --quick, make bench

The machine is usually shared, so no figure is a single timing: every case
builds all its contenders, then runs them in alternating rounds (A, B, C,
matmul probe, A, B, C, probe, ...) and reports medians. Ratios between
contenders (and to the probe) come from the same rounds, which is what makes
them comparable when absolute numbers drift with the load.

Sections (`--sections`):
  inference  images/s for every (variant, image size, batch, dtype, impl)
  training   the project's own trainer (keras_vit.training.train: its
             strategy.run step and its tf.data pipeline decoding and
             augmenting JPEGs), `fit` of keras-vit and keras-hub, HF torch's
             training step, and the input pipeline alone
  tflite     batch-1 latency of the artifacts keras_vit.export writes
             (TFLite float32 / float16 / dynamic-range int8 / full-integer
             int8, ONNX float32) beside Keras, with top-1 agreement
  memory     peak RSS in a fresh process per contender: inference, and
             per training step

keras-hub and torch/transformers are optional (`pip install keras-hub`): a
missing one is reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

BENCH = os.path.abspath(__file__)
IMPLS = ("keras-vit", "keras-hub", "torch")
DTYPES = ("float32", "bfloat16")
SECTIONS = ("inference", "training", "tflite", "memory")
FULL_CASES = ("Ti/16@224", "S/16@224", "B/16@224", "B/16@384")
FULL_BATCHES = (1, 8, 32)
FULL_TRAIN_CASES = ("S/16@224", "B/16@224")
FULL_TRAIN_BATCHES = (16, 64)
FULL = {"cases": list(FULL_CASES), "batches": list(FULL_BATCHES), "train_cases": list(FULL_TRAIN_CASES),
        "train_batches": list(FULL_TRAIN_BATCHES), "rounds": 5, "block_seconds": 2.0}
QUICK = {"cases": ["B/16@224"], "batches": [8], "train_cases": ["S/16@224"], "train_batches": [16],
         "rounds": 3, "block_seconds": 1.0}
PIPELINE = "input pipeline (read, decode, Inception crop, flip)"  # the training section's data-only row
PROBE_SIZE = 2048  # the square matmul whose speed is taken as the limit
NUM_CLASSES = 10  # of every training contender (the JPEG folder has 10 classes)
TRAINING_COST = 3  # a training image costs ~3x the forward FLOPs (backward ~2x)
# TFLite/ONNX artifacts, by keras_vit.export format name, with the names the tables use.
ARTIFACTS = {
    "tflite": "TFLite float32",
    "tflite-fp16": "TFLite float16 weights",
    "tflite-dynamic": "TFLite dynamic-range int8 (int8 weights, float activations)",
    "tflite-int8": "TFLite full-integer int8 (calibrated)",
    "onnx": "ONNX Runtime float32",
}
INTEGER_ARTIFACTS = ("tflite-dynamic", "tflite-int8")  # no float32 matmul limit applies


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


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------

def _matching(contenders, texts):
    """The contenders whose label contains one of `texts` (all when none given)."""
    return [c for c in contenders if not texts or any(t in c.label for t in texts)]


def training_contenders(impls, dtypes, full: bool) -> List[Contender]:
    """The project's trainer and both Keras models' `fit`, float32 and
    mixed_bfloat16 with and without XLA; torch eager (bfloat16 by autocast).

    The quick run keeps every trainer path that matters on a CPU (float32
    XLA, bfloat16 both ways) and each peer's best float32 and bfloat16 path.
    """
    every = [(d, x) for d in DTYPES for x in (True, False)]
    quick_trainer = [("float32", True), ("bfloat16", True), ("bfloat16", False)]
    quick_fit = [("float32", True), ("bfloat16", False)]
    out = []
    if "keras-vit" in impls:
        out += [Contender("keras-vit", d, x, "train()") for d, x in (every if full else quick_trainer)]
        out += [Contender("keras-vit", d, x, "fit") for d, x in (every if full else quick_fit)]
    if "keras-hub" in impls:
        out += [Contender("keras-hub", d, x, "fit") for d, x in (every if full else quick_fit)]
    if "torch" in impls:
        out += [Contender("torch", d, False) for d in DTYPES]
    return [c for c in out if c.dtype in dtypes]


def write_jpeg_folder(root: str, image_size: int, count: int = 64, classes: int = NUM_CLASSES) -> str:
    """A folder dataset for the trainer (root/train/<class>/*.jpg and one
    image per class in root/val/), images of 8/7 x 10/7 the training size
    (256 x 320 for 224, stored as the resize-to-256 convention would),
    smooth random colour fields so JPEG decoding costs what a photo's does."""
    from PIL import Image

    rng = np.random.RandomState(0)
    height = image_size * 8 // 7
    width = image_size * 10 // 7
    for split, per_class in (("train", max(1, count // classes)), ("val", 1)):
        for c in range(classes):
            directory = os.path.join(root, split, f"class{c:02d}")
            os.makedirs(directory, exist_ok=True)
            for i in range(per_class):
                small = rng.randint(0, 256, (8, 10, 3)).astype(np.uint8)
                image = Image.fromarray(small).resize((width, height), Image.BICUBIC)
                noisy = np.clip(np.asarray(image, np.int16) + rng.randint(-12, 13, (height, width, 3)), 0, 255)
                Image.fromarray(noisy.astype(np.uint8)).save(os.path.join(directory, f"{i:04d}.jpg"), quality=90)
    return root


def trainer_config(data_root: str, workdir: str, variant: str, image_size: int, batch: int, dtype: str, xla: bool):
    """What `keras-vit train --model VARIANT --data folder:DATA --image-size SIZE
    --batch-size BATCH --optimizer adamw --learning-rate 1e-4 --weight-decay 1e-4
    [--precision mixed_bfloat16] [--no-jit]` runs: the finetune recipe with
    the peers' optimizer (AdamW), Inception crop + flip, global-norm
    clipping, no checkpoints, evaluation or logging within the timed steps."""
    from keras_vit.training.config import TrainConfig

    return TrainConfig.create(
        "finetune", model=variant, dataset=f"folder:{data_root}", workdir=workdir,
        optimizer="adamw", learning_rate=1e-4, weight_decay=1e-4, warmup_steps=0, steps=10**9,
        batch_size=batch, image_size=image_size, train_augment="inception_crop_flip",
        precision=_keras_policy(dtype), jit_compile=xla, checkpoint_every=10**9, log_every=10**9,
        eval_every=0, progress=False)


class _StopTraining(Exception):
    pass


class TrainerSteps:
    """`keras_vit.training.train` running in a thread, one optimizer step per call.

    train() runs unchanged (its strategy, model, `_Steps`, tf.data pipeline
    and per-step bookkeeping); a step-end callback hands control back to the
    caller after every step and waits to be let go again, so a call of this
    object times exactly one iteration of the trainer's loop. Construction
    returns after the first step (building, compiling). Between calls the
    trainer's prefetch buffer may fill up (it is a few batches), so a slow
    input pipeline shows in the `input pipeline` row rather than here.
    """

    def __init__(self, config, timeout: float = 3600):
        from keras_vit.training import train

        self._go = threading.Semaphore(0)
        self._done: "queue.Queue" = queue.Queue()
        self._stop = False
        self._timeout = timeout

        trainer = self

        class Handoff:
            def on_step_end(self, step, logs):
                trainer._done.put(("step", logs["loss"]))
                trainer._go.acquire()
                if trainer._stop:
                    raise _StopTraining()

        def work():
            try:
                train(config, callbacks=[Handoff()])
                self._done.put(("error", RuntimeError("train() ended before the benchmark stopped it")))
            except _StopTraining:
                pass
            except BaseException as error:  # reported to the caller's thread
                self._done.put(("error", error))

        self._thread = threading.Thread(target=work, name="keras-vit-train", daemon=True)
        self._thread.start()
        self._wait()

    def _wait(self):
        kind, value = self._done.get(timeout=self._timeout)
        if kind == "error":
            raise value
        return value

    def __call__(self):
        self._go.release()
        return self._wait()

    def close(self):
        if self._thread.is_alive():
            self._stop = True
            self._go.release()
            self._thread.join(timeout=self._timeout)


def _fit_runner(impl, variant, size, batch, dtype, xla, steps):
    """`fit` on one in-memory batch repeated (nothing waits on input), AdamW."""
    import keras
    import tensorflow as tf

    if impl == "keras-vit":
        model = _keras_vit_model(variant, size, dtype, include_top=True, num_classes=NUM_CLASSES)
    else:
        backbone = _keras_hub_backbone(variant, size, dtype)
        images = keras.Input((size, size, 3))
        tokens = backbone(images)
        logits = keras.layers.Dense(NUM_CLASSES, dtype="float32", name="head")(tokens[:, 0])
        model = keras.Model(images, logits)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=xla,
    )
    data = tf.data.Dataset.from_tensors((
        _random_images(batch, size),
        np.random.RandomState(1).randint(0, NUM_CLASSES, (batch,)).astype("int32"),
    )).repeat()
    return lambda: model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)


def _torch_training_runner(variant, size, batch, dtype):
    """HF ViTForImageClassification: forward, cross-entropy, backward, AdamW."""
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    model = transformers.ViTForImageClassification(_torch_config(variant, size, num_labels=NUM_CLASSES)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    pixels = torch.from_numpy(_random_images(batch, size).transpose(0, 3, 1, 2).copy())
    labels = torch.from_numpy(np.random.RandomState(1).randint(0, NUM_CLASSES, (batch,)))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = model(pixel_values=pixels, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return run


def training_runner(c: Contender, variant, size, batch, data_root, workdir, fit_steps):
    """(run one optimizer step or `fit_steps` of them, steps per call, close)."""
    if c.path == "train()":
        trainer = TrainerSteps(trainer_config(data_root, workdir, variant, size, batch, c.dtype, c.xla))
        return trainer, 1, trainer.close
    if c.path == "fit":
        return _fit_runner(c.impl, variant, size, batch, c.dtype, c.xla, fit_steps), fit_steps, lambda: None
    return _torch_training_runner(variant, size, batch, c.dtype), 1, lambda: None


def input_pipeline_runner(data_root, workdir, variant, size, batch, batches_per_call):
    """The trainer's own training stream (data.train_dataset: read, decode,
    Inception crop, flip, batch, prefetch) consumed alone; a fresh iterator
    per call, so nothing prefetched while other contenders ran is counted."""
    import tensorflow as tf

    from keras_vit.training import data as data_lib

    config = trainer_config(data_root, workdir, variant, size, batch, "float32", True)
    source = data_lib.open_source(config)
    pipeline = data_lib.Pipeline((size, size), source.num_channels)
    dataset = data_lib.train_dataset(source, pipeline, config, tf.distribute.InputContext(), 0)
    dataset = dataset.take(batches_per_call)

    def run():
        for batch_ in dataset:
            batch_["image"].numpy()

    return run


def run_training(args, probe, log) -> List[dict]:
    """Per case: every training contender and the input pipeline in
    alternating rounds; images/s per optimizer step, as a fraction of the
    matmul limit at 3x the forward FLOPs per image."""
    rows = []
    for case in args.train_cases:
        variant, size = _parse_case(case)
        flops = TRAINING_COST * 2 * macs_per_image(variant, size)
        for batch in args.train_batches:
            scratch = tempfile.mkdtemp(prefix="keras-vit-bench-")
            try:
                rows += _training_case(args, probe, log, variant, size, batch, flops, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _training_case(args, probe, log, variant, size, batch, flops, scratch):
    data_root = write_jpeg_folder(os.path.join(scratch, "data"), size, count=max(64, 2 * batch))
    runners, contenders, steps, closers = {}, {}, {}, []
    for i, c in enumerate(_matching(training_contenders(args.impls, args.dtypes, full=not args.quick), args.match)):
        try:
            run, per_call, close = training_runner(c, variant, size, batch, data_root,
                                                   os.path.join(scratch, f"run{i}"), args.train_steps)
        except Exception as error:  # a peer that cannot build this case is reported, not fatal
            log(f"  skip training {c.label}: {type(error).__name__}: {error}")
            continue
        runners[c.label], contenders[c.label], steps[c.label] = run, c, per_call
        closers.append(close)
    runners[PIPELINE] = input_pipeline_runner(data_root, scratch, variant, size, batch, args.pipeline_batches)
    steps[PIPELINE] = args.pipeline_batches
    log(f"training {variant}@{size} batch {batch}: {len(contenders)} contenders + input pipeline")
    probe.reset()
    try:
        rounds = alternate(runners, args.rounds, args.block_seconds, probe, warmup=1)
    finally:
        for close in closers:
            close()
    rows = training_rows(rounds, steps, contenders, probe, variant, size, batch, flops)
    for row in rows:
        log(f"  {row['label']:34s} {row['images_per_s']:8.2f} img/s"
            + (f"  {row['fraction_of_peak']:.0%} of {row['dtype']} matmul peak" if row["fraction_of_peak"] else ""))
    return rows


def training_rows(rounds, steps, contenders, probe, variant, size, batch, flops) -> List[dict]:
    """Rows from one case's alternating rounds: `rounds` (label -> seconds
    per call in each round), `steps` (label -> optimizer steps, or pipeline
    batches, per call), `contenders` (label -> Contender; the input pipeline
    has none). Ratios compare medians over the same rounds."""
    per_step = {label: [t / steps[label] for t in times] for label, times in rounds.items()}
    rows = []
    for label, times in per_step.items():
        s = statistics.median(times)
        row = {"variant": variant, "image_size": size, "batch": batch, "label": label,
               "images_per_s": batch / s, "step_seconds": s, "round_seconds": times, "rounds": len(times)}
        if label not in contenders:
            row.update(impl="input pipeline", path="tf.data", dtype="float32", xla=False,
                       fraction_of_peak=None, gflops=None, matmul_peak_gflops=None)
        else:
            c = contenders[label]
            peak = probe.peak(c.dtype)
            row.update(**asdict(c), gflops=batch * flops / s / 1e9, matmul_peak_gflops=peak,
                       fraction_of_peak=batch * flops / s / 1e9 / peak)
        # (the input pipeline's images/s is no training speed: no ratios for it)
        references = contenders if label in contenders else {}
        row["vs_keras_hub_fit_float32_xla"] = _ratio_to(per_step, label, "keras-hub fit float32 XLA"
                                                        if "keras-hub fit float32 XLA" in references else None)
        row["vs_torch_float32"] = _ratio_to(per_step, label, "torch float32" if "torch float32" in references else None)
        row["probe"] = probe.summary()
        rows.append(row)
    return rows


# --------------------------------------------------------------------------
# TFLite and ONNX: the artifacts keras_vit.export writes, at batch 1.
# --------------------------------------------------------------------------

def tflite_artifacts(model, formats, scratch, calibration, reference, min_agreement, log):
    """{format: (bytes, notes)} through keras_vit.export's own converters:
    one SavedModel source (pixels 0..255 in, probabilities out) for every
    TFLite kind, tf2onnx for ONNX."""
    from keras_vit.export import onnx_model, tflite

    source = os.path.join(scratch, "tflite_source")
    out = {}
    for fmt in formats:
        start = time.perf_counter()
        if fmt == "onnx":
            path = os.path.join(scratch, "model.onnx")
            with contextlib.redirect_stdout(open(os.devnull, "w")):
                onnx_model.write(model, path)
            with open(path, "rb") as f:
                out[fmt] = (f.read(), {"opset": onnx_model.OPSET})
        else:
            if not os.path.isdir(source):
                tflite.write_source(model, source)
            # min_agreement 0 keeps the first plan, "all int8": a full-integer model.
            out[fmt] = tflite.convert(source, fmt, calibration, reference,
                                      max_accuracy_drop=1.0, min_agreement=min_agreement)
        log(f"  converted {fmt} in {time.perf_counter() - start:.0f} s")
    return out


def _onnx_runner(content, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(content, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: session.run(None, {name: images})[0]


def _tflite_runner(content, threads):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content, num_threads=threads)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0]["index"], interpreter.get_output_details()[0]["index"]

    def run(image):
        interpreter.set_tensor(inp, image)
        interpreter.invoke()
        return interpreter.get_tensor(out)

    return run


def run_tflite(args, probe, log) -> List[dict]:
    """Batch-1 latency of every artifact beside Keras (the same pixels-to-
    probabilities function, TF graph, all cores), and each one's top-1
    agreement with Keras.

    The model is a randomly initialised ViT with its zero-initialised head
    replaced by random weights (so the argmax depends on the image), fed
    random pixels: calibration and agreement images are random, which is
    enough for timing and for checking that a conversion keeps the argmax,
    not for accuracy (keras-vit export measures that on real data).
    """
    import tensorflow as tf

    from keras_vit.export import serving
    from keras_vit.export.data import Images

    variant, size = _parse_case(args.tflite_case)
    model = _keras_vit_model(variant, size, "float32", include_top=True)
    head = model.get_layer("head")
    kernel = head.kernel
    kernel.assign(np.random.RandomState(2).normal(0, kernel.shape[0] ** -0.5, kernel.shape).astype("float32"))
    rng = np.random.RandomState(3)
    calibration = Images(rng.uniform(0, 255, (args.calibration_images, size, size, 3)).astype("float32"),
                         source="random pixels")
    agreement_images = rng.uniform(0, 255, (args.agreement_images, size, size, 3)).astype("float32")
    reference_on_calibration = serving.keras_probabilities(model, calibration.images)
    keras_reference = serving.keras_probabilities(model, agreement_images)
    formats = [f for f in ARTIFACTS if f != "onnx" or _has("tf2onnx", "onnxruntime")]
    scratch = tempfile.mkdtemp(prefix="keras-vit-bench-")
    try:
        artifacts = tflite_artifacts(model, formats, scratch, calibration, reference_on_calibration,
                                     args.int8_min_agreement, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    keras_fn = tf.function(lambda x: serving.probabilities(model, x))
    predictors = {"keras": lambda image: keras_fn(tf.constant(image)).numpy()}
    for fmt, (content, _) in artifacts.items():
        predictors[fmt] = (_onnx_runner if fmt == "onnx" else _tflite_runner)(content, args.tflite_threads)
    agreement = {}
    for name, predict in predictors.items():
        top1 = np.array([predict(image[None]).argmax() for image in agreement_images])
        agreement[name] = float(np.mean(top1 == keras_reference.argmax(1)))
    image = agreement_images[:1]
    runners = {name: (lambda predict=predict: predict(image)) for name, predict in predictors.items()}
    log(f"tflite {variant}@{size} batch 1, {args.tflite_threads} threads: {', '.join(runners)}")
    probe.reset()
    rounds = alternate(runners, args.rounds, args.block_seconds, probe)
    flops = 2 * macs_per_image(variant, size)
    cores = _cores()
    rows = []
    for name, times in rounds.items():
        s = statistics.median(times)
        content, notes = artifacts.get(name, (None, {}))
        rows.append({
            "variant": variant, "image_size": size, "format": name,
            "kind": "Keras float32 (TF graph)" if name == "keras" else ARTIFACTS[name],
            "threads": cores if name == "keras" else args.tflite_threads,
            "latency_ms": 1000 * s, "round_seconds": times,
            "megabytes": None if content is None else len(content) / 2 ** 20,
            "speedup_vs_tflite_float32": _ratio_to(rounds, name, "tflite"),
            "speedup_vs_keras": _ratio_to(rounds, name, "keras"),
            "top1_agreement_with_keras": agreement[name], "agreement_images": len(agreement_images),
            # integer kernels: a float32 fraction would be no limit at all
            "fraction_of_float32_peak": None if name in INTEGER_ARTIFACTS else flops / s / 1e9 / probe.peak("float32"),
            "int8_plan": notes.get("plan"),
            "calibration": f"{len(calibration)} random-pixel images" if name == "tflite-int8" else None,
        })
        log(f"  {rows[-1]['kind']:62s} {1000 * s:8.1f} ms  top-1 agreement {agreement[name]:.0%}")
    return rows


def _has(*modules):
    try:
        for module in modules:
            __import__(module)
        return True
    except ImportError:
        return False


# --------------------------------------------------------------------------
# Memory: each contender in a fresh process.
# --------------------------------------------------------------------------

def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mib():
    # VmHWM, not ru_maxrss: the latter carries the parent's peak across exec.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_child(spec_json: str):
    """In a fresh process: RSS after imports, peak RSS over the whole life
    (building and compiling included) and, where the kernel allows resetting
    the peak, the peak during steady steps only (after a warm-up call)."""
    spec = json.loads(spec_json)
    c = Contender(spec["impl"], spec["dtype"], spec["xla"], spec.get("path", ""))
    import tensorflow  # noqa: F401  (every child pays the same imports)

    if c.impl == "torch":
        import torch  # noqa: F401
    before = _rss_mib()
    close = lambda: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="keras-vit-bench-") as scratch:
        if spec["mode"] == "training":
            data_root = write_jpeg_folder(os.path.join(scratch, "data"), spec["image_size"],
                                          count=max(64, 2 * spec["batch"]))
            run, _, close = training_runner(c, spec["variant"], spec["image_size"], spec["batch"], data_root,
                                            os.path.join(scratch, "run"), 1)
        else:
            run = inference_runner(c.impl, spec["variant"], spec["image_size"], spec["batch"], c.dtype, c.xla)
        run()
        life_peak = _peak_mib()
        steady = _reset_peak()
        for _ in range(3):
            run()
        step_peak = _peak_mib() if steady else None
        life_peak = max(life_peak, _peak_mib())
        close()
    print(json.dumps({"baseline_mib": before, "peak_mib": life_peak, "step_peak_mib": step_peak}))


def run_memory(args, log) -> List[dict]:
    jobs = []
    for case in args.memory_cases:
        variant, size = _parse_case(case)
        for batch in args.memory_batches:
            for c in _matching(inference_contenders(args.impls, args.dtypes), args.match):
                jobs.append(("inference", c, variant, size, batch))
    for case in args.memory_train_cases:
        variant, size = _parse_case(case)
        for batch in args.memory_train_batches:
            for c in _matching(training_contenders(args.impls, args.dtypes, full=not args.quick), args.match):
                jobs.append(("training", c, variant, size, batch))
    rows = []
    for mode, c, variant, size, batch in jobs:
        spec = json.dumps({"mode": mode, **asdict(c), "variant": variant, "image_size": size, "batch": batch})
        result = subprocess.run([sys.executable, BENCH, "--memory-child", spec],
                                capture_output=True, text=True, timeout=1800)
        try:
            child = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            log(f"  memory {mode} {c.label}: failed: {result.stderr.strip().splitlines()[-1:]}")
            continue
        peak = child["step_peak_mib"] or child["peak_mib"]
        rows.append({
            "mode": mode, "variant": variant, "image_size": size, "batch": batch, **asdict(c), "label": c.label,
            "peak_rss_mib": peak, "over_imports_mib": peak - child["baseline_mib"],
            "steady_steps_only": child["step_peak_mib"] is not None,
            "whole_process_peak_rss_mib": child["peak_mib"],
        })
        log(f"  memory {mode:9s} {c.label:34s} peak {peak:7.0f} MiB  (+{rows[-1]['over_imports_mib']:.0f} over imports)")
    return rows


# --------------------------------------------------------------------------
# Machine, report
# --------------------------------------------------------------------------

def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def describe_machine() -> dict:
    import keras
    import tensorflow as tf

    cpu, flags = platform.processor(), []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__}
    for name in ("keras_hub", "torch", "transformers", "ai_edge_litert", "onnxruntime", "tf2onnx"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    return {
        "cpu": cpu,
        "cores": _cores(),
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
            lines.append(
                f"| {row['variant']}@{row['image_size']} | {row['batch']} | {row['label']} | {row['images_per_s']:.2f} | "
                f"{_times(row['vs_keras_hub_float32_xla'])} | {_times(row['vs_torch_float32'])} | "
                f"{_percent(row['fraction_of_peak'])} |"
            )
        lines.append("")
    training = report.get("training", [])
    if training:
        lines += ["| training step | batch | implementation | images/s | vs keras-hub fit f32 XLA | vs torch f32 | "
                  "of matmul peak (3x forward) |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for row in training:
            lines.append(f"| {row['variant']}@{row['image_size']} | {row['batch']} | {row['label']} | "
                         f"{row['images_per_s']:.2f} | {_times(row['vs_keras_hub_fit_float32_xla'])} | "
                         f"{_times(row['vs_torch_float32'])} | {_percent(row['fraction_of_peak'])} |")
        lines.append("")
    tflite = report.get("tflite", [])
    if tflite:
        lines += ["| batch-1 latency (keras-vit) | threads | artifact | latency ms | MiB | vs TFLite float32 | "
                  "top-1 agreement with Keras | of f32 matmul peak |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for row in tflite:
            size = "-" if row["megabytes"] is None else f"{row['megabytes']:.1f}"
            lines.append(f"| {row['variant']}@{row['image_size']} | {row['threads']} | {row['kind']} | "
                         f"{row['latency_ms']:.1f} | {size} | {_times(row['speedup_vs_tflite_float32'])} | "
                         f"{row['top1_agreement_with_keras']:.0%} of {row['agreement_images']} | "
                         f"{_percent(row['fraction_of_float32_peak'])} |")
        lines.append("")
    memory = report.get("memory", [])
    if memory:
        lines += ["| peak memory | mode | batch | implementation | peak RSS MiB | over imports MiB |",
                  "|---|---|---:|---|---:|---:|"]
        for row in memory:
            lines.append(f"| {row['variant']}@{row['image_size']} | {row['mode']} | {row['batch']} | {row['label']} | "
                         f"{row['peak_rss_mib']:.0f} | {row['over_imports_mib']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def _percent(fraction):
    return "-" if fraction is None else f"{fraction:.0%}"


def _times(ratio):
    return "-" if ratio is None else f"{ratio:.2f}x"


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--quick", action="store_true",
                        help="inference B/16@224 batch 8; training S/16@224 batch 16 on the paths that matter on "
                             "a CPU; 3 rounds of about 1 s")
    parser.add_argument("--cases", nargs="+", default=None, metavar="VARIANT@SIZE",
                        help=f"inference models (default: {' '.join(FULL_CASES)}; --quick: {QUICK['cases'][0]})")
    parser.add_argument("--batches", nargs="+", type=int, default=None,
                        help=f"inference batches (default: {' '.join(map(str, FULL_BATCHES))}; --quick: "
                             f"{QUICK['batches'][0]})")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--match", nargs="+", default=None, metavar="TEXT",
                        help="only the inference/training contenders whose label contains one of these, "
                             "e.g. --match train() 'torch float32'")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating repetitions; medians are reported (default 5; --quick: 3)")
    parser.add_argument("--block-seconds", type=float, default=None,
                        help="each contender runs about this long per round (default 2; --quick: 1)")
    parser.add_argument("--train-cases", nargs="+", default=None, metavar="VARIANT@SIZE",
                        help=f"training models (default: {' '.join(FULL_TRAIN_CASES)}; --quick: "
                             f"{QUICK['train_cases'][0]})")
    parser.add_argument("--train-batches", nargs="+", type=int, default=None,
                        help=f"training batches (default: {' '.join(map(str, FULL_TRAIN_BATCHES))}; --quick: "
                             f"{QUICK['train_batches'][0]})")
    parser.add_argument("--train-steps", type=int, default=2, help="optimizer steps per `fit` call")
    parser.add_argument("--pipeline-batches", type=int, default=8,
                        help="batches per call of the input-pipeline contender (a fresh iterator each call, "
                             "its start-up included)")
    parser.add_argument("--tflite-case", default="B/16@224")
    parser.add_argument("--tflite-threads", type=int, default=2)
    parser.add_argument("--calibration-images", type=int, default=16,
                        help="random-pixel images calibrating the full-integer int8 model")
    parser.add_argument("--agreement-images", type=int, default=16,
                        help="random-pixel images for each artifact's top-1 agreement with Keras")
    parser.add_argument("--int8-min-agreement", type=float, default=0.0,
                        help="keras_vit.export's denylist search threshold; 0 keeps the first plan (all int8, "
                             "full-integer); 0.99 searches as `keras-vit export` does")
    parser.add_argument("--memory-cases", nargs="+", default=["B/16@224"], metavar="VARIANT@SIZE",
                        help="peak memory of each inference contender at these models (default B/16@224)")
    parser.add_argument("--memory-batches", nargs="+", type=int, default=[8])
    parser.add_argument("--memory-train-cases", nargs="*", default=["S/16@224"], metavar="VARIANT@SIZE",
                        help="per-step peak memory of each training contender (default S/16@224; none skips it)")
    parser.add_argument("--memory-train-batches", nargs="+", type=int, default=[16])
    parser.add_argument("--output", default="bench.json", help="JSON results")
    parser.add_argument("--markdown", default=None, help="also write the tables to this file")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)


def fill_defaults(args):
    """Options left unset take the --quick or the full run's values."""
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def run(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.memory_child:
        return memory_child(args.memory_child)
    fill_defaults(args)
    available = []
    for impl in args.impls:
        module = {"keras-vit": "keras_vit", "keras-hub": "keras_hub", "torch": "transformers"}[impl]
        try:
            __import__(module)
            available.append(impl)
        except ImportError as error:
            print(f"bench: {impl} not installed ({error}); skipped", file=sys.stderr)
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
        probe.reset()
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv)) or 0


if __name__ == "__main__":
    # Benchmark the checkout this file belongs to, not whatever keras_vit is installed.
    sys.path.insert(0, os.path.dirname(os.path.dirname(BENCH)))
    sys.exit(main())
