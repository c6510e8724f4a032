"""The trainer's compiled steps: N optimizer steps per host call, one all-reduce each.

One optimizer step, per replica:
  1. `local_gradients` (XLA with jit_compile): the replica's batch is split
     into `accum_steps` micro-batches; their gradients of
     sum(weight x per-example loss) / global batch are summed (times the loss
     scale under mixed_float16), and so are the step's figures (loss and
     metric sums, the example count);
  2. ONE all-reduce (a sum over every replica of every worker) of the
     gradients together with those figures;
  3. `_update`: unscale, clip to the global norm of the reduced gradient (the
     global gradient: Keras' own clipping would see each replica's part),
     `optimizer.apply`. Keras' TF optimizer would sum the gradients over the
     replicas again inside `apply` when called in a replica context; the
     trainer turns that off (`_reduce_once`), as the sum is already made.
With one replica and XLA, steps 1-3 are one XLA program (nothing to reduce).

`run_loop(iterator, n)` runs n such steps inside one tf.function (a device
loop) and returns a (n, k) table of the per-step figures, which are the same
on every replica after the all-reduce: the host reads them once per loop, so
the device never waits for Python between steps (Orbit's steps_per_loop,
Keras' steps_per_execution).
"""

from __future__ import annotations

import functools
from typing import Dict, List

import keras
import tensorflow as tf

from keras_vit.training.strategies import resolve_jit_compile  # noqa: F401  (its home: the strategy's facts)

SUM = tf.distribute.ReduceOp.SUM


def _compiled(method, **options):
    """tf.function of one CompiledSteps' method, traced once per run.

    No autograph: the steps are plain TF, and converting Keras' code costs
    seconds. Through a functools.partial: TensorFlow counts traces per Python
    code object (a bound method's function), so with the method itself every
    run after the fifth in one process (a notebook's sweep, the experiments)
    printed "5 out of the last 5 calls ... triggered tf.function retracing",
    though each run traces its own steps once; a partial is counted as itself."""
    return tf.function(functools.partial(method), autograph=False, **options)


def _reduce_once(optimizer) -> None:
    """Makes `optimizer.apply` take gradients that are already summed over the
    replicas, by replacing the TF optimizer's private `_all_reduce_sum_gradients`
    on this instance with the identity.

    Why a private hook (Keras 3.15): the TF optimizer all-reduces in `apply`
    whenever it runs in a replica context, and has no public switch (Keras 2's
    `experimental_aggregate_gradients=False` is gone). The public way around,
    calling `apply` in a cross-replica context (a `merge_call`, where the
    optimizer skips its sum), does not hold for the mixed_float16 trainer:
    `LossScaleOptimizer.apply` refuses a cross-replica context ("apply() must
    be called in a replica context") and applies its inner optimizer back in
    each replica, where the sum would be made again. Summing twice would
    multiply the gradients by the number of replicas (or cost a second
    all-reduce to divide out), so the hook stays (docs/architecture.md,
    "Private APIs still used"), checked here (a Keras without it stops at
    build, before any step), by tests/test_private_apis.py (the hook exists
    on every optimizer the trainer builds, and replacing it removes the
    gradients' all-reduce from `apply`) and by
    tests/test_training_distributed.py, which counts the all-reduces of a
    traced two-replica step."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not hasattr(inner, "_all_reduce_sum_gradients"):
        raise RuntimeError("This Keras' TF optimizer has no _all_reduce_sum_gradients: the trainer cannot "
                           "keep it from summing the gradients a second time. Please report it.")
    inner._all_reduce_sum_gradients = list


def current_learning_rate(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    lr = inner.learning_rate
    return lr(inner.iterations) if callable(lr) else lr


class CompiledSteps:
    """The compiled train loop and eval loop of one model/optimizer/strategy."""

    def __init__(self, strategy, model, optimizer, task, plan):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.task = task
        self.global_batch = plan.global_batch
        self.accum_steps = plan.accum_steps
        self.clip_norm = plan.recipe.grad_clip_norm
        jit_compile = plan.jit_compile
        self.loss_scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.columns: List[str] = []  # the names of run_loop's columns, known once traced
        _reduce_once(optimizer)
        # A loss that gathers every replica's examples (Task.gathers_across_replicas) calls a collective,
        # which may not sit inside a nested tf.function: its replica steps are traced in the loop's own.
        gathers = task.gathers_across_replicas and strategy.num_replicas_in_sync > 1
        self.local_gradients = (self._local_gradients if gathers
                                else _compiled(self._local_gradients, jit_compile=jit_compile))
        # With one replica the sum over replicas is the identity, and the whole
        # step (gradients and update) is one XLA program, as Keras `fit`
        # compiles its step. With several, Keras' optimizer enters a
        # merge_call, which may not sit inside a nested tf.function, let alone XLA.
        self.whole_step = None
        if jit_compile and strategy.num_replicas_in_sync == 1:
            self.whole_step = _compiled(self._whole_step, jit_compile=True)
        self.local_eval = self._local_eval if gathers else _compiled(self._local_eval, jit_compile=jit_compile)
        self.run_loop = _compiled(self._run_loop)
        self.eval_loop = _compiled(self._eval_loop)
        self.agree_to_stop = _compiled(self._agree_to_stop)
        self.step_sums = _compiled(self._step_sums)

    # --- one replica's step -------------------------------------------------------------

    def _micro_step(self, batch):
        variables = self.model.trainable_variables
        weight = tf.cast(batch["weight"], tf.float32)  # 0 for an example whose file could not be decoded
        with tf.GradientTape() as tape:
            per_example_loss, metrics = self.task.compute_loss(self.model, batch, training=True)
            per_example_loss = tf.cast(per_example_loss, tf.float32) * weight
            loss = tf.reduce_sum(per_example_loss) / self.global_batch
            if self.loss_scaling:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        sums = {"loss": tf.reduce_sum(per_example_loss), "count": tf.reduce_sum(weight)}
        sums.update({k: tf.reduce_sum(tf.cast(v, tf.float32) * weight) for k, v in metrics.items()})
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

    def _update(self, grads):
        """Unscale, clip to the global norm, apply; -> (norm, next learning rate)."""
        scale = tf.cast(self.optimizer.dynamic_scale, tf.float32) if self.loss_scaling else 1.0
        if self.loss_scaling:
            grads = [g / scale for g in grads]
        if self.clip_norm is not None:
            grads, norm = tf.clip_by_global_norm(grads, self.clip_norm)
        else:
            norm = tf.linalg.global_norm(grads)
        # The loss-scale optimizer unscales (and skips non-finite steps) itself.
        self.optimizer.apply([g * scale for g in grads] if self.loss_scaling else grads,
                             self.model.trainable_variables)
        return norm, tf.cast(current_learning_rate(self.optimizer), tf.float32)

    def _replica_step(self, batch) -> Dict[str, tf.Tensor]:
        if self.whole_step is not None:
            return self.whole_step(batch)
        grads, sums = self.local_gradients(batch)
        # The one all-reduce of the step: gradients and figures together.
        grads, sums = tf.distribute.get_replica_context().all_reduce(SUM, (grads, sums))
        norm, lr = self._update(grads)
        return {**sums, "grad_norm": norm, "lr": lr}

    def _whole_step(self, batch) -> Dict[str, tf.Tensor]:
        """One replica's step as one program (one replica: nothing to all-reduce)."""
        grads, sums = self._local_gradients(batch)
        norm, lr = self._update(grads)
        return {**sums, "grad_norm": norm, "lr": lr}

    # --- loops on the device ------------------------------------------------------------

    def _run_loop(self, iterator, num_steps):
        """`num_steps` optimizer steps -> (num_steps, len(columns)) float32."""
        def body(i, table):
            figures = self.strategy.run(self._replica_step, args=(next(iterator),))
            # Every replica holds the same (all-reduced) figures: read the first.
            figures = self.strategy.experimental_local_results(figures)[0]
            self.columns = sorted(figures)
            return i + 1, table.write(i, tf.stack([tf.cast(figures[k], tf.float32) for k in self.columns]))

        table = tf.TensorArray(tf.float32, size=num_steps, element_shape=None)
        _, table = tf.while_loop(lambda i, _: i < num_steps, body, (tf.constant(0), table))
        return table.stack()

    def _local_eval(self, batch):
        return self.task.weighted_sums(self.model, batch)

    def _eval_loop(self, iterator, num_steps):
        """Sums over `num_steps` evaluation batches of every replica: {name: scalar}."""
        def replica_eval(batch):
            # Called through a Python function: a jit-compiled function handed to
            # strategy.run directly is placed on the first device only.
            return self.local_eval(batch)

        def body(i, totals):
            sums = self.strategy.run(replica_eval, args=(next(iterator),))
            sums = {k: self.strategy.reduce(SUM, v, axis=None) for k, v in sums.items()}
            return i + 1, {k: totals[k] + sums[k] for k in totals}

        first = self.strategy.run(replica_eval, args=(next(iterator),))
        totals = {k: self.strategy.reduce(SUM, v, axis=None) for k, v in first.items()}
        _, totals = tf.while_loop(lambda i, _: i < num_steps, body, (tf.constant(1), totals))
        return totals

    def _agree_to_stop(self, flag):
        """The sum over every replica of every worker of the stop flag: all
        workers stop at the same loop boundary when any of them was signalled."""
        flags = self.strategy.run(lambda: tf.identity(flag))
        return self.strategy.reduce(SUM, flags, axis=None)

    def _step_sums(self, step):
        """(sum, sum of squares) of `step` (float64) over every replica of every
        worker: all workers hold the same step exactly when n x the second
        equals the first squared."""
        values = self.strategy.run(lambda: tf.stack([step, step * step]))
        return self.strategy.reduce(SUM, values, axis=None)
