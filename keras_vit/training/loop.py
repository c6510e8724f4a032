"""The training loop: one custom loop over `strategy.run` for every strategy.

One optimizer step, per replica:
  1. `local_gradients` (XLA-compiled with jit_compile): the replica's batch is
     split into `accum_steps` micro-batches; their gradients of
     sum(per-example loss) / global batch are summed (times the loss scale
     under mixed_float16);
  2. the gradients are all-reduced (summed) over all replicas and workers,
     unscaled, and clipped to the global norm: clipping must see the global
     gradient, so it is not left to Keras, which clips each replica's part;
  3. `optimizer.apply`, which sums over replicas once more (Keras always
     does), so it is given the clipped gradient / num_replicas.
Keras `fit` is not used: it does not work under MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import Iterable, Optional

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from keras_vit import runs
from keras_vit.model import fuse_gelu, rematerialize_blocks
from keras_vit.training import data as data_lib
from keras_vit.training.checkpointing import CheckpointManager
from keras_vit.training.config import RECIPES, TrainConfig
from keras_vit.training.evaluation import extract_features, few_shot_linear_eval
from keras_vit.training.optimization import make_optimizer
from keras_vit.training.strategies import is_chief, make_strategy, resolve_name
from keras_vit.training.tasks import Task, make_task
from keras_vit.training.transfer import apply_weights, resolve_weights
from keras_vit.variants import get_variant


class NonFiniteLossError(RuntimeError):
    """The loss (or the weights) became NaN or infinite."""


class TrainingInterrupted(RuntimeError):
    """SIGTERM or Ctrl-C (SIGINT): a checkpoint was written and training
    stopped; re-run to resume. `exit_code` is 128 + the signal number."""

    def __init__(self, message, signum=signal.SIGTERM):
        super().__init__(message)
        self.signum = int(signum)
        self.exit_code = 128 + self.signum


def resolve_model_config(config: TrainConfig, initial=None):
    """The ViTConfig to build: the variant (or the `.keras` source's
    architecture) with the run's patch size and position embedding and the
    recipe's representation layer, classifier and regularisation."""
    if config.model is None:
        if initial is None or initial.source_config is None:
            raise ValueError("Name a model (--model, e.g. B/16), unless --weights is a .keras file or a workdir.")
        base = initial.source_config
    else:
        base = get_variant(config.model)
        source = initial.source_config if initial is not None else None
        if source is not None:  # a .keras model or workdir: its architecture is what loads
            sizes = ("hidden_size", "num_layers", "num_heads", "mlp_dim")
            if any(getattr(source, k) != getattr(base, k) for k in sizes) or (source.resnet is None) != (
                    base.resnet is None):
                raise ValueError(f"--model {config.model} does not match the architecture of the weights "
                                 f"({initial.description}): leave --model out to take the weights' own.")
            base = source
    if config.patch_size is not None and config.patch_size != base.patch_size:
        if initial is not None:
            raise ValueError(f"--patch-size {config.patch_size} differs from the pre-trained weights' "
                             f"patch size {base.patch_size}.")
        base = base.replace(patch_size=config.patch_size)
    if config.position_embedding is not None and config.position_embedding != base.position_embedding:
        if initial is not None:
            raise ValueError(f"--position-embedding {config.position_embedding} differs from the pre-trained "
                             f"weights' {base.position_embedding!r} ({initial.description}): drop "
                             f"--position-embedding, or train from scratch without --weights.")
        base = base.replace(position_embedding=config.position_embedding)
    recipe = config.recipe
    representation = (base.representation_size or base.hidden_size) if recipe.representation_layer else None
    # Pre-trained weights fix the classifier (a class token or not): a
    # classifier chosen against them is an error, the recipe's default is not.
    chosen = recipe.classifier
    if initial is not None and chosen is not None and chosen != base.classifier:
        named = RECIPES.get(recipe.name)
        if named is None or named.classifier != chosen:
            raise ValueError(f"--classifier {chosen} contradicts the pre-trained weights ({initial.description}), "
                             f"which use the {base.classifier!r} classifier: drop --classifier, or train from "
                             f"scratch without --weights.")
    return base.replace(
        representation_size=representation,
        classifier=(chosen or base.classifier) if initial is None else base.classifier,
        dropout_rate=recipe.dropout_rate,
        stochastic_depth_rate=recipe.stochastic_depth_rate,
    )


def _image_size(config, source):
    size = config.recipe.image_size or source.image_size
    if size is None:
        raise ValueError(f"{source.name} has images of varying size: set --image-size.")
    return (size, size) if isinstance(size, int) else tuple(size)


class _StopSignals:
    """SIGTERM and Ctrl-C (SIGINT), main thread only: the first sets `raised`;
    the loop finishes its step, checkpoints and stops. A second Ctrl-C gets
    Python's own handler back, so it aborts at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.raised = False
        self.signum = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        self.raised = True
        self.signum = self.signum or signum
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, _handler(self._previous[signal.SIGINT], signum))

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, _handler(previous, signum))


def _handler(previous, signum):
    # A handler installed outside Python reads as None; put Python's default back then.
    if previous is not None:
        return previous
    return signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL


def train(config: TrainConfig, task: Optional[Task] = None,
          callbacks: Iterable = (), dataset=None) -> dict:
    """Trains (or resumes) the run described by `config`; returns results.json's dict.

    Args:
        config: a TrainConfig (see TrainConfig.create and demo_config).
        task: what is learned (default: config.task from TASKS, i.e. image
            classification); see keras_vit.training.tasks.Task.
        callbacks: each a callable `callback(step, logs)`, called after every
            optimizer step on every worker (logs: loss, accuracy, lr,
            grad_norm), or an object with `on_step_end(step, logs)` and/or
            `on_train_end(model, results)` methods.
        dataset: data given as an object instead of config.dataset (see
            keras_vit.training.data.open_source).
    Raises:
        NonFiniteLossError: the loss became NaN/inf (the last good checkpoint is kept).
        IncompatibleCheckpointError: the workdir holds another run's checkpoints.
        TrainingInterrupted: SIGTERM or Ctrl-C arrived; a checkpoint was written.
        CheckpointWriteError: a checkpoint could not be written (full disk,
            unwritable workdir); the previous one is intact.

    A run that has already finished (model.keras and results.json at
    `steps`) is not trained or evaluated again: its recorded results are
    returned. Each session of a resumed run is kept in results.json's
    "segments": the steps it covered, the settings changed since the
    previous session, and its figures.
    """
    started = time.time()
    # MultiWorkerMirroredStrategy wants to exist before other TF work.
    strategy = make_strategy(config.strategy, config.tpu)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(config.seed)
    chief = is_chief(strategy)
    recipe = config.recipe
    source = data_lib.open_source(config, dataset)
    task = task or make_task(config)
    initial = resolve_weights(config.weights)
    model_config = resolve_model_config(config, initial)
    pipeline = data_lib.Pipeline(_image_size(config, source), initial.num_channels if initial else source.num_channels)
    if initial is not None and initial.num_channels != source.num_channels:
        # Not an error (images are converted), but what ran must be visible.
        print(f"keras-vit train: the images have {source.num_channels} channel(s); the pre-trained weights take "
              f"{initial.num_channels}: images are converted to {initial.num_channels}.", flush=True)
    replicas = strategy.num_replicas_in_sync
    if recipe.batch_size % (replicas * config.accum_steps):
        raise ValueError(f"batch_size {recipe.batch_size} must be divisible by replicas ({replicas}) x "
                         f"accum_steps ({config.accum_steps}).")
    if chief:
        os.makedirs(config.workdir, exist_ok=True)

    jit_compile = resolve_jit_compile(config, strategy)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(config.precision)
    try:
        with strategy.scope():
            model = task.build_model(model_config, pipeline.image_size, source.num_classes, pipeline.num_channels)
            rematerialized_blocks = rematerialize_blocks(model) if config.remat else 0
            # XLA fuses the GELU by itself; TensorFlow's op-by-op executor gets one kernel each way.
            fused_gelu = not jit_compile and fuse_gelu(model) > 0
            optimizer = make_optimizer(recipe, config.precision)
            optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous_policy)

    fingerprint = {
        "task": task.name, "model": model_config.to_dict(), "image_size": list(pipeline.image_size),
        "num_classes": source.num_classes, "num_channels": pipeline.num_channels,
        "optimizer": type(getattr(optimizer, "inner_optimizer", optimizer)).__name__,
        "precision": config.precision,
    }
    manager = CheckpointManager(config.workdir, fingerprint, write=chief, keep=config.keep_checkpoints)
    restored = manager.restore(model, optimizer)
    if restored is None:
        step, examples_seen = 0, 0
        if initial is not None:
            apply_weights(model, initial)
    else:
        step, examples_seen = restored
    if step >= recipe.steps and runs.is_finished(config.workdir, recipe.steps):
        finished = runs.read_results(config.workdir)
        if chief:
            print(f"keras-vit train: the run in {config.workdir} already finished at step {step}; its results "
                  f"({runs.RESULTS_FILE}) are left as they are. Raise --steps to train further, or choose a new "
                  f"--workdir.", flush=True)
        finished["already_finished"] = True
        return finished

    # What actually runs, beside what was asked for (a recipe's None or a
    # dataset's size resolved), so that config.json and results.json say it.
    resolved = {
        "model": model_config.to_dict(), "classifier": model_config.classifier,
        "image_size": list(pipeline.image_size), "num_classes": source.num_classes,
        "num_channels": pipeline.num_channels, "strategy": resolve_name(config.strategy, config.tpu),
        "num_replicas": strategy.num_replicas_in_sync,
        "jit_compile": jit_compile,
        "rematerialized_blocks": rematerialized_blocks,
        "fused_gelu": fused_gelu,
    }
    settings = {**config.to_dict(), "resolved": resolved}
    history_before = runs.segments(config.workdir)
    segment = {"start_step": step, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if restored is not None:
        previous_settings = runs.read_config(config.workdir)
        if previous_settings:
            segment["changed"] = runs.changed_settings(previous_settings, settings)
        if history_before and "end_step" not in history_before[-1]:
            # The previous session stopped without a word (kill -9, power
            # loss): it reached at least the checkpoint resumed from.
            history_before[-1].update(end_step=step, ended="killed (resumed from its last checkpoint)")
    if chief:
        runs.write_config(config.workdir, settings)
        runs.write_labels(config.workdir, getattr(source, "class_names", None), source.num_classes)
        runs.write_results(config.workdir, {"status": "running", "steps": step,
                                            "segments": history_before + [segment]})

    trainer = _Steps(strategy, model, optimizer, task, config)
    dist_train = strategy.distribute_datasets_from_function(
        lambda ctx: data_lib.train_dataset(source, pipeline, config, ctx, examples_seen))
    eval_batch = _eval_batch_size(config, replicas)
    eval_steps = data_lib.eval_steps(source, eval_batch)
    dist_eval = strategy.distribute_datasets_from_function(
        lambda ctx: data_lib.eval_dataset(source, pipeline, eval_batch, eval_steps, ctx))

    def evaluate():
        iterator = iter(dist_eval)
        totals = None
        for _ in range(eval_steps):
            sums = {k: float(v) for k, v in trainer.eval_step(iterator).items()}
            totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
        count = totals.pop("count")
        return {"num_examples": int(count), **{k: v / count for k, v in totals.items()}}

    writer = tf.summary.create_file_writer(runs.tensorboard_dir(config.workdir)) if chief else None
    bar = _progress_bar(config, chief, step, model, source, strategy, pipeline)
    history, eval_history = [], []
    session_start_step, timer_start, timer_images = step, None, 0
    last_logs = {}
    iterator = iter(dist_train)
    with _StopSignals() as stop_signal:
        while step < recipe.steps:
            sums, stop, grad_norm = trainer.train_step(iterator, tf.constant(float(stop_signal.raised)))
            step += 1
            examples_seen += recipe.batch_size
            logs = {k: float(v) / recipe.batch_size for k, v in sums.items()}
            logs["lr"] = float(_current_lr(optimizer))
            logs["grad_norm"] = float(grad_norm)
            if not math.isfinite(logs["loss"]):
                raise NonFiniteLossError(
                    f"The training loss became {logs['loss']} at step {step}. Training stopped; the last good "
                    f"checkpoint ({manager.latest() or 'none yet'}) is kept. Lower the learning rate "
                    f"(--learning-rate), keep gradient clipping on (--grad-clip-norm), or check the data; "
                    f"re-running the command resumes from that checkpoint.")
            history.append(logs)
            if timer_start is None:  # the first step compiles: time the rest
                timer_start = time.time()
            else:
                timer_images += recipe.batch_size
            images_per_sec = timer_images / max(1e-9, time.time() - timer_start)
            _notify(callbacks, "on_step_end", step, logs)
            interrupted = float(stop) > 0
            if step % config.checkpoint_every == 0 or step == recipe.steps or interrupted:
                _save(manager, step, examples_seen, model, optimizer)
            if interrupted:
                signum = stop_signal.signum or signal.SIGTERM  # a worker told by another: SIGTERM
                if chief:
                    segment.update(end_step=step, ended="interrupted", train=_window(history, config))
                    runs.write_results(config.workdir, {"status": "interrupted", "steps": step,
                                                        "segments": history_before + [segment]})
                what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
                raise TrainingInterrupted(
                    f"{what}: checkpoint of step {step} written to {manager.directory}; "
                    f"re-run the same command to resume.", signum)
            if step % config.log_every == 0 or step == recipe.steps:
                window = history[-config.log_every:]
                last_logs = {k: float(np.mean([h[k] for h in window])) for k in ("loss", "accuracy")}
                last_logs.update(lr=logs["lr"], grad_norm=logs["grad_norm"], images_per_sec=images_per_sec)
                bar.set_postfix(loss=f"{last_logs['loss']:.4f}", acc=f"{last_logs['accuracy']:.3f}",
                                lr=f"{logs['lr']:.2e}", img_s=f"{images_per_sec:.0f}", refresh=False)
                if writer:
                    _write_scalars(writer, step, {f"train/{k}": v for k, v in last_logs.items()})
            bar.update(1)
            if config.eval_every and step % config.eval_every == 0 and step != recipe.steps:
                result = evaluate()
                eval_history.append({"step": step, **result})
                _log_eval(bar, writer, step, result)
    train_seconds = time.time() - (timer_start or time.time())
    final = evaluate()
    _log_eval(bar, writer, step, final)
    bar.close()
    results = {
        "eval": final,
        "eval_history": eval_history,
        "train": last_logs,
        "steps": step,
        "steps_this_session": step - session_start_step,
        "images_per_sec": timer_images / train_seconds if timer_images else None,
        "wall_time_s": None,
        "strategy": resolve_name(config.strategy, config.tpu),
        "num_replicas": replicas,
        "num_params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
        "dataset": {"name": source.name, "num_classes": source.num_classes, "sizes": source.sizes},
        "config": config.to_dict(),
        "resolved": resolved,
        "status": "finished",
    }
    if chief:
        exported = task.export_model(model)
        if config.fewshot_shots:
            feature_model = task.feature_model(exported)
            if feature_model is not None:
                results["fewshot"] = _few_shot(feature_model, source, pipeline, config, eval_batch)
            baseline = task.baseline_feature_model(exported)
            if baseline is not None:
                results["fewshot_random_init"] = _few_shot(baseline, source, pipeline, config, eval_batch)
        model_path = os.path.join(config.workdir, runs.MODEL_FILE)
        exported.save(model_path)
        results["model_path"] = model_path
        results["wall_time_s"] = time.time() - started
        segment.update(end_step=step, ended="finished", train=last_logs, eval=final,
                       images_per_sec=results["images_per_sec"], wall_time_s=results["wall_time_s"])
        results["segments"] = history_before + [segment]
        runs.write_results(config.workdir, results)
    results["wall_time_s"] = time.time() - started
    if writer:
        writer.flush()
    _notify(callbacks, "on_train_end", model, results)
    return results


def _window(history, config):
    window = history[-config.log_every:]
    return {k: float(np.mean([h[k] for h in window])) for k in ("loss", "accuracy")} if window else {}


def _notify(callbacks, event, *args):
    for callback in callbacks:
        method = getattr(callback, event, None)
        if method is None and event == "on_step_end" and callable(callback):
            method = callback
        if method is not None:
            method(*args)


class _Steps:
    """The compiled train and eval steps of one model/optimizer/strategy."""

    def __init__(self, strategy, model, optimizer, task, config):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.task = task
        self.global_batch = config.recipe.batch_size
        self.accum_steps = config.accum_steps
        self.clip_norm = config.recipe.grad_clip_norm
        self.loss_scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        jit = resolve_jit_compile(config, strategy)
        # No autograph: the steps are plain TF, and converting Keras' code costs seconds.
        self.local_gradients = tf.function(self._local_gradients, jit_compile=jit, autograph=False)
        self.local_eval = tf.function(self._local_eval, jit_compile=jit, autograph=False)
        self.train_step = tf.function(self._train_step, autograph=False)
        self.eval_step = tf.function(self._eval_step, autograph=False)

    def _micro_step(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            per_example_loss, metrics = self.task.compute_loss(self.model, batch, training=True)
            loss = tf.reduce_sum(per_example_loss) / self.global_batch
            if self.loss_scaling:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        sums = {"loss": tf.reduce_sum(per_example_loss)}
        sums.update({k: tf.reduce_sum(tf.cast(v, tf.float32)) for k, v in metrics.items()})
        return grads, sums

    def _local_gradients(self, batch):
        if self.accum_steps == 1:
            return self._micro_step(batch)
        # (accum * micro, ...) -> (accum, micro, ...): one micro-batch per iteration.
        micro = tf.nest.map_structure(
            lambda t: tf.reshape(t, [self.accum_steps, -1] + t.shape[1:].as_list()), batch)
        grads, sums = self._micro_step(tf.nest.map_structure(lambda t: t[0], micro))

        def body(i, grads, sums):
            more_grads, more_sums = self._micro_step(tf.nest.map_structure(lambda t: t[i], micro))
            return (i + 1, [a + b for a, b in zip(grads, more_grads)],
                    {k: sums[k] + more_sums[k] for k in sums})

        _, grads, sums = tf.while_loop(lambda i, *_: i < self.accum_steps, body, (tf.constant(1), grads, sums))
        return grads, sums

    def _replica_step(self, batch, stop):
        grads, sums = self.local_gradients(batch)
        context = tf.distribute.get_replica_context()
        replicas = self.strategy.num_replicas_in_sync
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        scale = tf.cast(self.optimizer.dynamic_scale, tf.float32) if self.loss_scaling else 1.0
        if self.loss_scaling:
            grads = [g / scale for g in grads]
        if self.clip_norm is not None:
            grads, norm = tf.clip_by_global_norm(grads, self.clip_norm)
        else:
            norm = tf.linalg.global_norm(grads)
        # optimizer.apply sums over replicas again (and unscales under loss scaling).
        self.optimizer.apply([g * (scale / replicas) for g in grads], self.model.trainable_variables)
        return sums, tf.identity(stop), norm

    def _train_step(self, iterator, stop):
        batch = next(iterator)
        sums, stop, norm = self.strategy.run(self._replica_step, args=(batch, stop))
        reduce = lambda op, v: self.strategy.reduce(op, v, axis=None)  # noqa: E731
        sums = {k: reduce(tf.distribute.ReduceOp.SUM, v) for k, v in sums.items()}
        return sums, reduce(tf.distribute.ReduceOp.SUM, stop), reduce(tf.distribute.ReduceOp.MEAN, norm)

    def _local_eval(self, batch):
        per_example_loss, metrics = self.task.compute_loss(self.model, batch, training=False)
        weight = batch["weight"]
        sums = {"loss": tf.reduce_sum(per_example_loss * weight), "count": tf.reduce_sum(weight)}
        sums.update({k: tf.reduce_sum(tf.cast(v, tf.float32) * weight) for k, v in metrics.items()})
        return sums

    def _eval_step(self, iterator):
        # Called through a Python function: a jit-compiled function handed to
        # strategy.run directly is placed on the first device only.
        sums = self.strategy.run(lambda batch: self.local_eval(batch), args=(next(iterator),))
        return {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}


def resolve_jit_compile(config, strategy) -> bool:
    """Whether the per-replica step is XLA-compiled: config.jit_compile when
    given; by default XLA, except mixed_bfloat16 on a CPU-only machine, where
    TensorFlow's oneDNN kernels without XLA measured 1.9x faster (the same
    run's bfloat16 matmul probe: 377 GFLOP/s with oneDNN, 165 under XLA;
    benchmarks/results_training.md). TPUStrategy compiles anyway."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return False
    if config.jit_compile is not None:
        return bool(config.jit_compile)
    on_cpu_only = not tf.config.list_logical_devices("GPU")
    return not (config.precision == "mixed_bfloat16" and on_cpu_only)


def _save(manager, step, examples_seen, model, optimizer):
    for v in model.trainable_variables:
        if not np.all(np.isfinite(v.numpy())):
            raise NonFiniteLossError(
                f"The weights became NaN or infinite at step {step} ({v.path}). Training stopped; the last good "
                f"checkpoint ({manager.latest() or 'none yet'}) is kept. Lower the learning rate or keep "
                f"gradient clipping on; re-running the command resumes from that checkpoint.")
    manager.save(step, examples_seen, model, optimizer)


def _current_lr(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    lr = inner.learning_rate
    return lr(inner.iterations) if callable(lr) else lr


def _eval_batch_size(config, replicas):
    batch = config.eval_batch_size or config.micro_batch_size
    return max(replicas, batch // replicas * replicas)


def _progress_bar(config, chief, step, model, source, strategy, pipeline):
    from tqdm.auto import tqdm

    enabled = chief and config.progress
    if enabled:
        params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        print(f"keras-vit train: {model.name} ({params:,} parameters) at {pipeline.image_size}, "
              f"recipe {config.recipe.name}, {source.name} ({source.num_classes} classes, "
              f"{source.sizes}), {type(strategy).__name__} x{strategy.num_replicas_in_sync}, "
              f"batch {config.recipe.batch_size} (accum {config.accum_steps}), {config.precision}"
              + (f", resuming at step {step}" if step else ""), flush=True)
    return tqdm(total=config.recipe.steps, initial=step, disable=not enabled, unit="step",
                dynamic_ncols=True, mininterval=1.0)


def _log_eval(bar, writer, step, result):
    if not bar.disable:
        bar.write(f"step {step}: eval top-1 {result['accuracy']:.4f}  top-5 {result['top5']:.4f}  "
                  f"loss {result['loss']:.4f}  ({result['num_examples']} examples)")
    if writer:
        _write_scalars(writer, step, {f"eval/{k}": result[k] for k in ("accuracy", "top5", "loss") if k in result})


# TensorBoard's scalar format, written with TF alone (the tensorboard package
# is needed only to view the logs, not to write them).
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR).SerializeToString()


def _write_scalars(writer, step, scalars):
    with writer.as_default(step=step):
        for tag, value in scalars.items():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), metadata=_SCALAR_METADATA)


def _few_shot(feature_model, source, pipeline, config, batch_size):
    pool = data_lib.plain_dataset(source, pipeline, source.train_split, batch_size, limit=config.fewshot_pool)
    test = data_lib.plain_dataset(source, pipeline, source.eval_split, batch_size, limit=None)
    train_x, train_y = extract_features(feature_model, pool)
    test_x, test_y = extract_features(feature_model, test)
    return {f"{k}shot": acc for k, acc in few_shot_linear_eval(
        train_x, train_y, test_x, test_y, shots=config.fewshot_shots, l2_reg=config.fewshot_l2,
        num_classes=source.num_classes, seed=config.seed).items()}
