"""The trainer: one custom loop over `strategy.run` for every strategy.

    Trainer(config).run()  ==  train(config)

`Trainer` is a run's life in short steps: `build` (strategy, data, model,
optimizer, compiled steps), `restore` (the latest checkpoint, else the
initial weights), `fit` (loops of `steps_per_loop` optimizer steps on the
device, one host read per loop; checkpoints, evaluation and signals at loop
boundaries), `evaluate`, `checkpoint` and `finish` (model.keras, few-shot,
results.json). What runs inside a loop is keras_vit.training.steps; what the
run folder holds, keras_vit.runs. Keras `fit` is not used: it does not work
under MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import Iterable, List, Optional

import keras
import numpy as np
import tensorflow as tf

from keras_vit import runs
from keras_vit.utils import console as _console, locks, storage
from keras_vit.errors import CannotContinue, UserError
from keras_vit.model import fuse_gelu, rematerialize_blocks
from keras_vit.model.lora import parameter_counts
from keras_vit.runs.adapter import peft_base, write_adapter, write_peft_adapter
from keras_vit.training import data as data_lib
from keras_vit.training import memory as memory_lib
from keras_vit.training import plan as plan_lib
from keras_vit.training import reporting
from keras_vit.training.checkpointing import CheckpointManager
from keras_vit.training.config import TrainConfig, upgraded
from keras_vit.training.optimization import averaged_weights, make_optimizer, rule_name
from keras_vit.training.steps import CompiledSteps
from keras_vit.tasks import Task, build_task_model
from keras_vit.training.transfer import apply_weights, find_vit


class NonFiniteLossError(CannotContinue):
    """The loss (or the weights) became NaN or infinite."""


class TrainingOutOfMemory(CannotContinue):
    """A training step ran out of memory; the message says what ran and the ways out."""


class TrainingInterrupted(CannotContinue):
    """SIGTERM or Ctrl-C (SIGINT): a checkpoint was written and training
    stopped; re-run to resume. `exit_code` is 128 + the signal number."""

    def __init__(self, message, signum=signal.SIGTERM):
        super().__init__(message)
        self.signum = int(signum)
        self.exit_code = 128 + self.signum


def train(config: TrainConfig, task: Optional[Task] = None,
          callbacks: Iterable = (), dataset=None) -> dict:
    """Trains (or resumes) the run described by `config`; returns results.json's dict.

    Args:
        config: a TrainConfig (see TrainConfig.create and demo_config).
        task: what is learned (default: config.task from TASKS, i.e. image
            classification); see keras_vit.tasks.Task.
        callbacks: each a callable `callback(step, logs)`, called for every
            optimizer step on every worker (logs: loss, accuracy, lr,
            grad_norm) once the loop holding it has ended, or an object with
            `on_step_end(step, logs)` and/or `on_train_end(model, results)`.
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
    return Trainer(config, task, callbacks, dataset).run()


class Trainer:
    """One training session of a run (see the module docstring)."""

    def __init__(self, config: TrainConfig, task: Optional[Task] = None, callbacks: Iterable = (), dataset=None):
        self.requested = config  # as given (config.json); what runs is self.plan, from build() on
        self.injected_task = task  # None: the one config asks for (the plan resolves it)
        self.callbacks = list(callbacks)
        self.dataset = dataset
        self.step = 0
        self.examples_seen = 0
        self.history: List[dict] = []  # per-step logs of this session
        self.eval_history: List[dict] = []
        self.last_logs: dict = {}
        self.timer = reporting.Throughput()

    # --- set-up -------------------------------------------------------------------------

    def run(self) -> dict:
        """build, restore, fit, finish, holding the workdir's lock (WorkdirBusy if
        another run holds it); the recorded results of a finished run as they are."""
        self.started = time.time()
        # One writer per workdir, locked before anything is read or written (the
        # chief alone in a multi-worker run: its workers are that one writer).
        with locks.held(self.requested.workdir, locks.writer_role(self.requested.strategy)):
            self.build()
            if self.restore():
                return self.already_finished()
            try:
                self.start_session()
                self.fit()
                return self.finish()
            finally:
                self._close_inputs()

    def build(self) -> None:
        """The run's plan (strategy, Task, weights, data), then model, optimizer, compiled steps."""
        config = self.requested
        # From here on the run reads the plan and nothing else: the strategy, the Task, the weights, the
        # data, the model, XLA resolved once (its config holds the resolved recipe).
        self.plan = plan_lib.plan_run(config, self.injected_task, self.dataset)
        self.strategy, self.chief = self.plan.distribution, self.plan.chief
        if config.deterministic:
            tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(config.seed)
        if self.chief:  # before anything is built: they may explain what follows
            for warning in self.plan.warnings:
                data_lib.warn(warning)
        if self.plan.initial is not None and self.plan.initial.num_channels != self.plan.source.num_channels:
            # Not an error (images are converted), but what ran must be visible.
            print(f"keras-vit train: the images have {self.plan.source.num_channels} channel(s); the pre-trained "
                  f"weights take {self.plan.initial.num_channels}: images are converted.", flush=True)
        memory_lib.check_fits(self.plan)  # refused with the ways out, before anything is built
        self._build_model()
        self.compiled = CompiledSteps(self.strategy, self.model, self.optimizer, self.plan.task, self.plan)

    def _build_model(self) -> None:
        previous_policy = keras.config.dtype_policy()
        plan = self.plan
        keras.config.set_dtype_policy(plan.precision)
        try:
            with self.strategy.scope():
                self.model = build_task_model(self.plan.task, plan)
                # What building did, for results.json's "built" (the plan says what was asked).
                self.built = {"rematerialized_blocks": rematerialize_blocks(self.model) if plan.remat else 0,
                              # XLA fuses the GELU by itself; TensorFlow's op-by-op executor gets one kernel each way.
                              "fused_gelu": not plan.jit_compile and fuse_gelu(self.model) > 0}
                self.optimizer = make_optimizer(plan.recipe, plan.precision, self.model)
                self.optimizer.build(self.model.trainable_variables)
        finally:
            keras.config.set_dtype_policy(previous_policy)

    def _fingerprint(self) -> dict:
        return {
            "task": self.plan.task.name, "model": self.plan.model.to_dict(),
            "image_size": list(self.plan.image_size), "num_classes": self.plan.num_classes,
            "num_channels": self.plan.num_channels,
            "optimizer": rule_name(self.optimizer),
            "precision": self.plan.precision,
        }

    def restore(self) -> bool:
        """Opens the run's checkpoints and loads the latest (else the initial weights); True
        when the run has already finished."""
        self.manager = CheckpointManager(self.plan.config.workdir, self._fingerprint(), write=self.chief,
                                         keep=self.plan.config.keep_checkpoints)
        restored = self.manager.restore(self.model, self.optimizer)
        self.resumed = restored is not None
        if restored is None:
            if self.plan.initial is not None:
                note = apply_weights(self.model, self.plan.initial)
                if note and self.chief:
                    print(f"keras-vit train: {note}", flush=True)
        else:
            self.step, self.examples_seen = restored
        self._check_same_step()
        return self.step >= self.plan.steps and runs.is_finished(self.plan.config.workdir, self.plan.steps)

    def _check_same_step(self) -> None:
        """Every worker must resume at the same step: one that read another
        checkpoint (a workdir not shared, a copy behind) would train another run."""
        if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return
        total, squares = (float(v) for v in self.compiled.step_sums(tf.constant(float(self.step), tf.float64)))
        replicas = self.strategy.num_replicas_in_sync
        if replicas * squares != total * total:
            raise CannotContinue(
                f"The workers restored different steps (this one {self.step}, the mean {total / replicas:g}): they do "
                f"not see the same checkpoints in {self.manager.directory}. Give every worker the same "
                f"{_console.either('--workdir', 'workdir')} on "
                f"storage they all read (a shared filesystem, gs://), then re-run the same command.")

    def already_finished(self) -> dict:
        """The results of a run that already reached its steps, left as they are
        (one line says so); marked "already_finished"."""
        finished = runs.read_results(self.plan.config.workdir)
        if self.chief:
            print(f"keras-vit train: the run in {self.plan.config.workdir} already finished at step {self.step}; its "
                  f"results ({runs.RESULTS_FILE}) are left as they are. Raise {_console.either('--steps', 'steps')} "
                  f"to train further, or choose a new {_console.either('--workdir', 'workdir')}.", flush=True)
        finished["already_finished"] = True
        return finished

    def start_session(self) -> None:
        """Records the session (config.json, labels.txt, results.json "running"),
        opens the input streams and the progress display."""
        config = self.plan.config
        self.session_start_step = self.step
        self.segments_before = runs.segments(config.workdir)
        self.segment = {"start_step": self.step, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        settings = {**self.requested.to_dict(), "plan": self.plan.to_dict()}
        if self.resumed:
            previous_settings = upgraded(runs.read_config(config.workdir))
            if previous_settings:
                self.segment["changed"] = runs.changed_settings(previous_settings, settings)
            if self.segments_before and "end_step" not in self.segments_before[-1]:
                # The previous session stopped without a word (kill -9, power
                # loss): it reached at least the checkpoint resumed from.
                self.segments_before[-1].update(end_step=self.step, ended="killed (resumed from its last checkpoint)")
        if self.chief:
            storage.makedirs(config.workdir)
            runs.write_config(config.workdir, settings)
            runs.write_labels(config.workdir, self.plan.source.class_names, self.plan.source.num_classes)
            self._write_status("running")
        if self.chief:
            data_lib.check_stream_mixing(self.plan.source, config)
        self._open_inputs()
        self.report = reporting.Report(self.plan, self.chief, self.step, self.model, self.plan.source, self.strategy)

    def _open_inputs(self) -> None:
        train = self.strategy.distribute_datasets_from_function(
            lambda ctx: data_lib.train_dataset(self.plan.source, self.plan, ctx, self.examples_seen))
        self.train_iterator = iter(train)
        self.eval_inputs = self.strategy.distribute_datasets_from_function(
            lambda ctx: data_lib.eval_dataset(self.plan.source, self.plan, self.plan.eval_steps, ctx))

    def _close_inputs(self) -> None:
        """Drops the input streams now, while Python runs their decoders (tf.numpy_function).
        Left to the interpreter's exit, a stream whose prefetch waits in a decoder deadlocks
        the exit: its destructor waits for the decoder, which waits for the interpreter."""
        self.train_iterator = self.eval_inputs = None  # (also where start_session failed before opening them)

    # --- training -----------------------------------------------------------------------

    def fit(self) -> None:
        """Loops of steps until `steps`; checkpoints, evaluation and signals at loop ends."""
        try:
            self._fit()
        except BaseException:
            self.report.close()  # whatever is said next starts on a line of its own
            raise

    def _fit(self) -> None:
        with _StopSignals() as stop_signals:
            while self.step < self.plan.steps:
                self.run_loop(self._loop_length())
                if self._stop_agreed(stop_signals):
                    self.checkpoint()
                    self._interrupted(stop_signals.signum)
                if self.step % self.plan.config.checkpoint_every == 0 or self.step == self.plan.steps:
                    self.checkpoint()
                if self._at(self.plan.config.eval_every) and self.step != self.plan.steps:
                    result = self.evaluate()
                    self.eval_history.append({"step": self.step, **result})
                    self.report.eval(self.step, result)

    def _loop_length(self) -> int:
        """Steps to the next boundary: the end, a checkpoint, an evaluation, or steps_per_loop."""
        ends = [self.plan.steps, _next_multiple(self.step, self.plan.config.checkpoint_every)]
        if self.plan.config.eval_every:
            ends.append(_next_multiple(self.step, self.plan.config.eval_every))
        return min(self.plan.steps_per_loop, min(ends) - self.step)

    def _at(self, every: int) -> bool:
        return bool(every) and self.step % every == 0

    def run_loop(self, num_steps: int) -> List[dict]:
        """`num_steps` optimizer steps on the device, one host read; -> their logs."""
        self.timer.loop_begins()
        table = self._on_device(self.compiled.run_loop, self.train_iterator, tf.constant(num_steps, tf.int32)).numpy()
        self.timer.loop_done(num_steps * self.plan.global_batch)
        logs = [self._step_logs(row) for row in table]
        for row_logs in logs:
            self.step += 1
            self.examples_seen += self.plan.global_batch
            if not math.isfinite(row_logs["loss"]):
                raise NonFiniteLossError(
                    f"The training loss became {row_logs['loss']} at step {self.step}. Training stopped; the "
                    f"last good checkpoint ({self.manager.latest() or 'none yet'}) is kept. Lower the learning "
                    f"rate ({_console.either('--learning-rate', 'learning_rate')}), keep gradient clipping on "
                    f"({_console.either('--grad-clip-norm', 'grad_clip_norm')}), or check the data; "
                    f"re-running the command resumes from that checkpoint.")
            self.history.append(row_logs)
            _notify(self.callbacks, "on_step_end", self.step, row_logs)
            if self._at(self.plan.config.log_every) or self.step == self.plan.steps:
                self._log()
        self.report.advance(num_steps)
        return logs

    def _on_device(self, function, *args):
        """Runs a compiled loop; a --strict-data stop in its input and running
        out of memory become the one-line errors they are."""
        try:
            return function(*args)
        except tf.errors.ResourceExhaustedError:
            raise TrainingOutOfMemory(
                f"Out of memory in {memory_lib.what_runs(self.plan)} (about "
                f"{memory_lib.gigabytes(self.plan.memory.total)} by estimate): "
                f"{memory_lib.ways_out(self.plan.micro_batch)}.") from None
        except tf.errors.OpError as error:
            message = data_lib.strict_failure(error)
            if message is None:
                raise
            raise UserError(message) from None

    def _step_logs(self, row) -> dict:
        figures = dict(zip(self.compiled.columns, (float(v) for v in row)))
        batch = self.plan.global_batch
        # Averages over the examples that count (weight > 0), as evaluation's:
        # the gradient alone is divided by the nominal batch (one all-reduce a step).
        count = max(figures["count"], 1e-9)
        logs = {k: v / count for k, v in figures.items() if k not in ("count", "grad_norm", "lr")}
        logs.update(lr=figures["lr"], grad_norm=figures["grad_norm"])
        if figures["count"] < batch:  # examples of unreadable files carry no weight
            logs["skipped_examples"] = batch - figures["count"]
        return logs

    def _log(self) -> None:
        self.last_logs = {**_window(self.history, self.plan.config),
                          "lr": self.history[-1]["lr"], "grad_norm": self.history[-1]["grad_norm"],
                          "images_per_sec": self.timer.images_per_sec()}
        self.report.train(self.step, self.last_logs)

    def _stop_agreed(self, stop_signals) -> bool:
        """Whether any worker was signalled: one small all-reduce per loop
        where there are several workers, the local flag otherwise."""
        if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return stop_signals.raised
        return float(self.compiled.agree_to_stop(tf.constant(float(stop_signals.raised)))) > 0

    def _interrupted(self, signum) -> None:
        signum = signum or signal.SIGTERM  # a worker told by another: SIGTERM
        if self.chief:
            self.segment.update(end_step=self.step, ended="interrupted", train=_window(self.history, self.plan.config))
            self._write_status("interrupted")
        what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        raise TrainingInterrupted(f"{what}: checkpoint of step {self.step} written to {self.manager.directory}; "
                                  f"re-run the same command to resume.", signum)

    def checkpoint(self) -> None:
        """Writes the run's checkpoint (model, optimizer, step, input position)
        after checking that the weights are finite; non-finite weights stop the
        run with NonFiniteLossError and keep the last good checkpoint."""
        for v in self.model.trainable_variables:
            if not np.all(np.isfinite(v.numpy())):
                raise NonFiniteLossError(
                    f"The weights became NaN or infinite at step {self.step} ({v.path}). Training stopped; the "
                    f"last good checkpoint ({self.manager.latest() or 'none yet'}) is kept. Lower the learning "
                    f"rate or keep gradient clipping on; re-running the command resumes from that checkpoint.")
        self.manager.save(self.step, self.examples_seen, self.model, self.optimizer)

    def evaluate(self) -> dict:
        """Loss and metrics over the whole evaluation split (every worker its shard, summed)."""
        # With recipe.ema the moving average is what is evaluated (and exported).
        with averaged_weights(self.model, self.optimizer):
            return self._evaluate_as_is()

    def _evaluate_as_is(self) -> dict:
        totals = self._on_device(self.compiled.eval_loop, iter(self.eval_inputs), tf.constant(self.plan.eval_steps))
        return self.plan.task.summarize({k: float(v) for k, v in totals.items()})

    # --- the end ------------------------------------------------------------------------

    def finish(self) -> dict:
        """Final evaluation; the chief writes model.keras, few-shot figures and results.json,
        all of the weights' moving average where there is one (swapped in once, here)."""
        with averaged_weights(self.model, self.optimizer):
            return self._finish()

    def _finish(self) -> dict:
        final = self._evaluate_as_is()
        counts = parameter_counts(self.model)
        self.report.eval(self.step, final)
        self.report.close()
        results = {
            "eval": final, "eval_history": self.eval_history, "train": self.last_logs, "steps": self.step,
            "steps_this_session": self.step - self.session_start_step,
            "images_per_sec": self.timer.images_per_sec(), "wall_time_s": None,
            "strategy": self.plan.strategy, "num_replicas": self.plan.num_replicas,
            "num_params": counts["trainable"],
            "parameters": counts,  # {"trainable", "total"}: a LoRA run trains a part
            "dataset": {"name": self.plan.source.name, "num_classes": self.plan.source.num_classes,
                        "sizes": self.plan.source.sizes},
            "data_problems": self.plan.source.problems.summary(),
            "config": self.requested.to_dict(), "plan": self.plan.to_dict(), "built": self.built,
            "status": "finished",
        }
        if self.chief:
            self._write_model_and_results(results, final)
        results["wall_time_s"] = time.time() - self.started
        _notify(self.callbacks, "on_train_end", self.model, results)
        return results

    def _write_model_and_results(self, results, final) -> None:
        exported = self.plan.task.export_model(self.model)
        if self.plan.config.fewshot_shots:
            results.update(self._few_shot(exported))
        results["model_path"] = runs.save_model(self.plan.config.workdir, exported)
        # What a classifier's LoRA run trained, apart from its base (keras_vit.training.load_adapter); another
        # Task's head lies outside the ViT, so its model.keras (LoRA merged) is what the run keeps.
        if self.plan.model.lora_rank and self.plan.task.exports_classifier:
            vit, workdir, weights = find_vit(self.model), self.plan.config.workdir, _absolute(self.requested.weights)
            results["adapter_path"] = write_adapter(workdir, vit, weights)
            base = peft_base(weights) if vit.pre_logits is None else None
            folder = None if base is None else write_peft_adapter(workdir, vit, base)
            if folder is not None:  # an HF transformers base: the same adapter in peft's layout, for PyTorch
                results["peft_adapter_path"] = folder
        results["wall_time_s"] = time.time() - self.started
        self.segment.update(end_step=self.step, ended="finished", train=self.last_logs, eval=final,
                            images_per_sec=results["images_per_sec"], wall_time_s=results["wall_time_s"])
        results["segments"] = self.segments_before + [self.segment]
        runs.write_results(self.plan.config.workdir, results)

    def _few_shot(self, exported) -> dict:
        out = {}
        feature_model = self.plan.task.feature_model(exported)
        args = (self.plan.source, self.plan, self.plan.eval_batch)
        if feature_model is not None:
            out["fewshot"] = reporting.few_shot(feature_model, *args)
        baseline = self.plan.task.baseline_feature_model(exported)
        if baseline is not None:
            out["fewshot_random_init"] = reporting.few_shot(baseline, *args)
        return out

    def _write_status(self, status) -> None:
        runs.write_results(self.plan.config.workdir, {"status": status, "steps": self.step,
                                                 "segments": self.segments_before + [self.segment]})


def _absolute(weights: str) -> str:
    """--weights as an adapter records its base: a local path made absolute (a relative one would
    not load from another directory), a name (hf:, official) as it is."""
    return os.path.abspath(weights) if os.path.exists(weights) else weights


def _next_multiple(step, every):
    return (step // every + 1) * every


def _window(history, config):
    """The mean over the last log_every steps of the loss and top-1 (a classifier's, masked patches'), or
    of the loss and every metric of another Task."""
    window = history[-config.log_every:]
    if not window:
        return {}
    figures = ("loss", "accuracy") if "accuracy" in window[-1] else [
        k for k in window[-1] if k not in ("lr", "grad_norm", "skipped_examples")]
    return {k: float(np.mean([h[k] for h in window])) for k in figures}


def _notify(callbacks, event, *args):
    for callback in callbacks:
        method = getattr(callback, event, None)
        if method is None and event == "on_step_end" and callable(callback):
            method = callback
        if method is not None:
            method(*args)


class _StopSignals:
    """SIGTERM and Ctrl-C (SIGINT), main thread only: the first sets `raised`;
    the trainer finishes the loop in flight, checkpoints and stops. A second
    Ctrl-C gets Python's own handler back, so it aborts at once
    (KeyboardInterrupt)."""

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
