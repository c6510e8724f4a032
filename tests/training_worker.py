"""One training run in a fresh process, for test_training_distributed.py.

    python -m tests.training_worker '{"workdir": ..., "overrides": {...}, ...}'

Keys: workdir, overrides (tiny_config fields; "model" as a ViTConfig dict),
logical_cpus (split the CPU into N devices before TF starts), kill_at (SIGKILL
this process after that step), weights_out (write the final model variables
to this .npz), mirrored_vs_one_device (train twice, print the largest
difference of the weights; with "comparisons" {name: overrides} instead of
"overrides", one such pair for each, one RESULT line each, in order),
count_all_reduces (build the Trainer, run one loop of 2 steps and count the
ReplicaContext.all_reduce calls that carry the gradients while it is traced;
beside mirrored_vs_one_device: a list of the comparisons whose mirrored run
counts them, all its traces together), count_writes (count this process's writes
through keras_vit.utils.storage), record_images (a hash of each training image this
worker's input pipeline handed to its steps, in order). Prints one JSON line
starting with RESULT.
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _Record:
    def __init__(self, spec):
        self.spec = spec
        self.losses = []
        self.weights = None

    def on_step_end(self, step, logs):
        self.losses.append(logs["loss"])
        if step == self.spec.get("kill_at"):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_end(self, model, results):
        import numpy as np

        self.weights = [np.asarray(v.numpy()) for v in model.trainable_variables]
        if self.spec.get("weights_out"):
            np.savez(self.spec["weights_out"], *self.weights)


def _config(workdir, overrides):
    from keras_vit import ViTConfig
    from tests.training_helpers import tiny_config

    overrides = dict(overrides)
    if isinstance(overrides.get("model"), dict):
        overrides["model"] = ViTConfig(**overrides["model"])
    return tiny_config(workdir, **overrides)


def main(spec):
    import tensorflow as tf

    if spec.get("logical_cpus"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * spec["logical_cpus"])
        # A compute thread per logical device: with the suite's one (the Makefile's
        # TF_NUM_INTRAOP_THREADS=1) the replicas' steps wait on each other (alone: 73 s
        # wall for 46 CPU-s; with two threads 44 s; in the suite up to 181 s for 53 CPU-s).
        tf.config.threading.set_intra_op_parallelism_threads(spec["logical_cpus"])
    from keras_vit import training

    record = _Record(spec)
    if spec.get("mirrored_vs_one_device"):
        _mirrored_vs_one_device(spec)
        return
    if spec.get("count_all_reduces"):
        print("RESULT " + json.dumps(_count_all_reduces(spec)), flush=True)
        return
    writes = _count_writes() if spec.get("count_writes") else None
    images = _record_images() if spec.get("record_images") else None
    results = training.train(_config(spec["workdir"], spec.get("overrides", {})), callbacks=[record])
    out = {"losses": record.losses, "eval": results["eval"], "steps": results["steps"],
           "replicas": results["num_replicas"], "steps_this_session": results["steps_this_session"],
           "parameters": results["parameters"]}
    if writes is not None:
        out["writes"] = len(writes)
    if images is not None:  # the pipeline may have read ahead: keep the batches the steps took
        per_batch = len(images) and len(images[0])
        out["image_hashes"] = [h for batch in images[:results["steps_this_session"]] for h in batch]
        out["per_batch"] = per_batch
    print("RESULT " + json.dumps(out), flush=True)


def _mirrored_vs_one_device(spec):
    """Each comparison trained under MirroredStrategy, then the same on one
    device; -> one RESULT line each. Every mirrored run comes first and all
    share the process's one MirroredStrategy: a second MirroredStrategy in a
    process (or one made after another strategy ran) waits in its collectives
    (tens of seconds a run); which strategy object a run is handed changes
    nothing it computes."""
    import numpy as np
    import tensorflow as tf

    from keras_vit import training
    from keras_vit.training import strategies as strategies_lib

    comparisons = spec.get("comparisons") or {"": spec.get("overrides", {})}
    comparisons = {name: _with_base(overrides, spec["workdir"]) for name, overrides in comparisons.items()}
    counted = set(spec.get("count_all_reduces") or ())
    make_strategy, strategies = strategies_lib.make_strategy, {}

    def shared(name="auto", tpu=None):
        if name != "mirrored":
            return make_strategy(name, tpu)
        if name not in strategies:
            strategies[name] = make_strategy(name, tpu)
        return strategies[name]

    out = {name: {} for name in comparisons}
    strategies_lib.make_strategy = shared  # what the run's plan makes its strategy with
    try:
        for strategy in ("mirrored", "one_device"):
            for name, overrides in comparisons.items():
                record = _Record(spec)
                config = _config(os.path.join(spec["workdir"], name, strategy), dict(overrides, strategy=strategy))
                sizes = []
                original = tf.distribute.ReplicaContext.all_reduce
                if strategy == "mirrored" and name in counted:
                    def counting(self, reduce_op, value, options=None, _original=original):
                        sizes.append(len(tf.nest.flatten(value)))
                        return _original(self, reduce_op, value, options)

                    tf.distribute.ReplicaContext.all_reduce = counting
                try:
                    results = training.train(config, callbacks=[record])
                finally:
                    tf.distribute.ReplicaContext.all_reduce = original
                out[name][strategy] = {"weights": record.weights, "replicas": results["num_replicas"],
                                       "losses": record.losses, "eval": results["eval"], "steps": results["steps"]}
                if strategy == "mirrored" and name in counted:
                    num_variables = len(record.weights)  # the gradient list (with or without figures)
                    out[name]["counted"] = {"gradient_all_reduces": sum(1 for n in sizes if n >= num_variables),
                                            "replicas": results["num_replicas"], "steps": results["steps"],
                                            "num_variables": num_variables}
    finally:
        strategies_lib.make_strategy = make_strategy
    for name, runs in out.items():
        one, mirrored = runs["one_device"], runs["mirrored"]
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(one["weights"], mirrored["weights"]))
        moved = max(float(np.max(np.abs(a))) for a in mirrored["weights"])
        result = {
            "name": name, "max_weight_difference": diff, "max_weight": moved,
            "replicas": {k: runs[k]["replicas"] for k in ("one_device", "mirrored")},
            "steps": {k: runs[k]["steps"] for k in ("one_device", "mirrored")},
            "losses": {k: runs[k]["losses"] for k in ("one_device", "mirrored")},
            "eval_loss": {k: runs[k]["eval"]["loss"] for k in ("one_device", "mirrored")}}
        if "counted" in runs:
            result["all_reduces"] = runs["counted"]
        print("RESULT " + json.dumps(result), flush=True)


def _with_base(overrides, workdir):
    """The overrides with "@base" (as weights) an official-format .npz of a random ViT of the
    tiny runs' architecture, written once into `workdir`."""
    if overrides.get("weights") != "@base":
        return overrides
    import keras

    import keras_vit
    from tests.training_helpers import TINY

    path = os.path.join(workdir, "base.npz")
    if not os.path.exists(path):
        os.makedirs(workdir, exist_ok=True)
        keras.utils.set_random_seed(1)
        keras_vit.save_weights(keras_vit.ViT(TINY, image_size=28, num_classes=10), path)
    return dict(overrides, weights=path)


def _count_writes():
    from keras_vit.utils import storage

    calls = []
    for name in ("write_bytes", "makedirs", "remove", "save_keras_model"):
        original = getattr(storage, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(storage, name, counting)
    return calls


def _record_images():
    import hashlib

    import numpy as np
    import tensorflow as tf

    from keras_vit.training import data as data_lib

    batches = []
    original = data_lib.train_dataset

    def hashes(images):
        batches.append([hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()[:16] for image in images])
        return np.int64(len(batches))

    def recording(*args, **kwargs):
        def record(batch):
            count = tf.numpy_function(hashes, [batch["image"]], tf.int64, stateful=True)
            with tf.control_dependencies([count]):
                return {k: tf.identity(v) for k, v in batch.items()}

        return original(*args, **kwargs).map(record)  # map keeps the order; one batch at a time

    data_lib.train_dataset = recording
    return batches


def _count_all_reduces(spec):
    import tensorflow as tf

    from keras_vit.training import Trainer

    trainer = Trainer(_config(spec["workdir"], spec.get("overrides", {})))
    trainer.build()
    trainer.restore()
    trainer.start_session()
    num_variables = len(trainer.model.trainable_variables)
    original = tf.distribute.ReplicaContext.all_reduce
    calls = []

    def counting(self, reduce_op, value, options=None):
        if len(tf.nest.flatten(value)) >= num_variables:  # the gradient list (with or without figures)
            calls.append(len(tf.nest.flatten(value)))
        return original(self, reduce_op, value, options)

    tf.distribute.ReplicaContext.all_reduce = counting
    try:
        trainer.run_loop(2)
    finally:
        tf.distribute.ReplicaContext.all_reduce = original
    return {"gradient_all_reduces": len(calls), "replicas": trainer.strategy.num_replicas_in_sync,
            "num_variables": num_variables, "steps": trainer.step}


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
