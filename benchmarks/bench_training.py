"""The training section of benchmarks/bench.py: the project's own trainer
(keras_vit.training.Trainer: "train()" runs one optimizer step per host call,
"train() loop 10" ten, as steps_per_loop 1 and 10), `fit` of keras-vit and
keras-hub, HF torch's training step, and the trainer's input pipeline
alone."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from dataclasses import asdict
from typing import List

import numpy as np

from bench_core import (DTYPES, Contender, _keras_hub_backbone, _keras_policy, _keras_vit_model, _matching,
                        _random_images, _ratio_to, _torch_config, alternate, macs_per_image, _parse_case)

NUM_CLASSES = 10  # of every training contender (the JPEG folder has 10 classes)
TRAINING_COST = 3  # a training image costs ~3x the forward FLOPs (backward ~2x)
PIPELINE = "input pipeline (read, decode, Inception crop, flip)"  # the section's data-only row


def training_contenders(impls, dtypes, full: bool, remat: bool = False, loops=(1, 10)) -> List[Contender]:
    """The project's trainer and both Keras models' `fit`, float32 and
    mixed_bfloat16 with and without XLA; torch eager (bfloat16 by autocast).

    The trainer runs once per steps-per-loop in `loops`: "train()" is one
    optimizer step per host call (as `fit`'s default steps_per_execution),
    "train() loop N" N steps per call (`keras-vit train --steps-per-loop N`).
    The quick run keeps every trainer path that matters on a CPU (float32
    XLA, bfloat16 both ways) and each peer's best float32 and bfloat16 path.
    With `remat`, also the trainer with rematerialised blocks ("train()
    remat", `keras-vit train --remat`, one step per call) on each of its paths.
    """
    every = [(d, x) for d in DTYPES for x in (True, False)]
    quick_trainer = [("float32", True), ("bfloat16", True), ("bfloat16", False)]
    quick_fit = [("float32", True), ("bfloat16", False)]
    out = []
    if "keras-vit" in impls:
        out += [Contender("keras-vit", d, x, _trainer_path(n)) for d, x in (every if full else quick_trainer)
                for n in loops]
        if remat:
            out += [Contender("keras-vit", d, x, "train() remat") for d, x in (every if full else quick_trainer)]
        out += [Contender("keras-vit", d, x, "fit") for d, x in (every if full else quick_fit)]
    if "keras-hub" in impls:
        out += [Contender("keras-hub", d, x, "fit") for d, x in (every if full else quick_fit)]
    if "torch" in impls:
        out += [Contender("torch", d, False) for d in DTYPES]
    return [c for c in out if c.dtype in dtypes]


def _trainer_path(steps_per_loop: int) -> str:
    return "train()" if steps_per_loop == 1 else f"train() loop {steps_per_loop}"


def _steps_per_loop(path: str) -> int:
    return int(path.rsplit(" ", 1)[1]) if " loop " in path else 1


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


def trainer_config(data_root: str, workdir: str, variant: str, image_size: int, batch: int, dtype: str, xla: bool,
                   remat: bool = False, steps_per_loop=None):
    """What `keras-vit train --model VARIANT --dataset folder:DATA --recipe finetune
    --image-size SIZE --batch-size BATCH --optimizer adamw --learning-rate 1e-4
    --weight-decay 1e-4 --warmup-steps 0 [--precision mixed_bfloat16] [--no-jit] [--remat]`
    runs: the finetune recipe with the peers' optimizer (AdamW), Inception
    crop + flip, global-norm clipping; no checkpoint, evaluation or log line
    falls within the timed steps."""
    from keras_vit.training.config import TrainConfig

    return TrainConfig.create(
        "finetune", model=variant, dataset=f"folder:{data_root}", workdir=workdir,
        optimizer="adamw", learning_rate=1e-4, weight_decay=1e-4, warmup_steps=0, steps=10**9,
        batch_size=batch, image_size=image_size, train_augment="inception_crop_flip",
        precision=_keras_policy(dtype), jit_compile=xla, checkpoint_every=10**9, log_every=10**9,
        eval_every=0, progress=False, remat=remat, steps_per_loop=steps_per_loop)


class TrainerLoop:
    """The project's Trainer driven directly: `steps_per_call` optimizer steps per call.

    Construction does what `Trainer.run` does before its loops (build:
    strategy, data, model, optimizer, compiled steps; restore; start_session:
    run folder and input streams) and one `run_loop(1)`, which traces and
    compiles. Each call is then one `trainer.run_loop(steps_per_call)`: that
    many steps in one tf.function on the device and one host read of their
    figures, i.e. one loop of `fit()` with steps_per_loop = steps_per_call
    (no checkpoint, evaluation or log line falls inside). Between calls the
    trainer's prefetch buffer may fill (a few batches), so a slow input
    pipeline shows in the `input pipeline` row rather than here.
    """

    def __init__(self, config, steps_per_call: int = 1, dataset=None):
        from keras_vit.training import Trainer

        self.steps_per_call = steps_per_call
        self.trainer = Trainer(config, dataset=dataset)
        self.trainer.build()
        self.trainer.restore()
        self.trainer.start_session()
        self.trainer.run_loop(1)  # trace and compile

    def __call__(self):
        return self.trainer.run_loop(self.steps_per_call)[-1]["loss"]

    def close(self):
        self.trainer = None


def _fit_runner(impl, variant, size, batch, dtype, xla, steps, clip_norm=None):
    """`fit` on one in-memory batch repeated (nothing waits on input), AdamW (clipping the
    gradient to the global norm `clip_norm`, as the trainer's recipes do, where given).

    tf.data's autotuning is off for this dataset (it has nothing to tune):
    every `fit` call makes a fresh iterator, and with autotuning on, a 2-step
    call (~3 s of steps here) returned at 5.11 s in about half the calls
    (2.55 s per step), the wait in the teardown after `on_train_end`
    (benchmarks/results_trainer_loop.md): a cost of calling `fit` again and
    again that a long `fit` run pays once per epoch.
    """
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
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=1e-4, global_clipnorm=clip_norm),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=xla,
    )
    options = tf.data.Options()
    options.autotune.enabled = False
    data = tf.data.Dataset.from_tensors((
        _random_images(batch, size),
        np.random.RandomState(1).randint(0, NUM_CLASSES, (batch,)).astype("int32"),
    )).repeat().with_options(options)
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
    if c.path.startswith("train()"):
        n = _steps_per_loop(c.path)
        trainer = TrainerLoop(trainer_config(data_root, workdir, variant, size, batch, c.dtype, c.xla,
                                             remat="remat" in c.path, steps_per_loop=n), steps_per_call=n)
        return trainer, n, trainer.close
    if c.path == "fit":
        return _fit_runner(c.impl, variant, size, batch, c.dtype, c.xla, fit_steps), fit_steps, lambda: None
    return _torch_training_runner(variant, size, batch, c.dtype), 1, lambda: None


def input_pipeline_runner(data_root, workdir, variant, size, batch, batches_per_call):
    """The trainer's own training stream (data.train_dataset: read, decode,
    Inception crop, flip, batch, prefetch) consumed alone; a fresh iterator
    per call, so nothing prefetched while other contenders ran is counted."""
    import tensorflow as tf

    from keras_vit.training import data as data_lib
    from keras_vit.training import plan as plan_lib

    config = trainer_config(data_root, workdir, variant, size, batch, "float32", True)
    source = data_lib.open_source(config)
    plan = plan_lib.resolve(config.replace(image_size=size), source)
    dataset = data_lib.train_dataset(source, plan, tf.distribute.InputContext(), 0)
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
    candidates = training_contenders(args.impls, args.dtypes, full=not args.quick, remat=args.remat)
    for i, c in enumerate(_matching(candidates, args.match)):
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
        log(f"  {row['label']:40s} {row['images_per_s']:8.2f} img/s"
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
        same_fit = Contender(c.impl, c.dtype, c.xla, "fit").label if label in contenders else None
        row["vs_fit_same_model"] = _ratio_to(per_step, label, same_fit if same_fit in references else None)
        row["probe"] = probe.summary()
        rows.append(row)
    return rows
