"""tf.distribute strategies by name.

- "default": the no-op strategy (one device, whatever TF picks).
- "one_device": the first GPU, else the CPU.
- "mirrored": all local GPUs (or, without GPUs, all logical CPU devices).
- "multi_worker": MultiWorkerMirroredStrategy over the cluster in TF_CONFIG.
- "tpu": TPUStrategy through TPUClusterResolver(tpu=--tpu or the TPU_NAME
  environment, "" = the local TPU VM); it connects, initialises the TPU
  system, and the step runs without an inner jit (TPU compiles everything).
- "auto": multi_worker if TF_CONFIG names more than one task, tpu if
  --tpu/TPU_NAME is set, mirrored with more than one GPU, else one_device.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from keras_vit.errors import UserError


def _cluster_size():
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except json.JSONDecodeError as error:
        raise UserError(f"TF_CONFIG is not valid JSON: {error}") from error
    return sum(len(v) for v in cluster.values())


def resolve_name(name: str, tpu=None) -> str:
    if name != "auto":
        return name
    if _cluster_size() > 1:
        return "multi_worker"
    if tpu is not None or os.environ.get("TPU_NAME"):
        return "tpu"
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return "mirrored"
    return "one_device"


def resolve_jit_compile(config, strategy) -> bool:
    """Whether the per-replica step is XLA-compiled: config.jit_compile when
    given; by default XLA, except mixed_bfloat16 on a CPU-only machine, where
    TensorFlow's oneDNN kernels without XLA measured faster
    (benchmarks/results_training.md). TPUStrategy compiles anyway."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return False
    if config.jit_compile is not None:
        return bool(config.jit_compile)
    on_cpu_only = not tf.config.list_logical_devices("GPU")
    return not (config.precision == "mixed_bfloat16" and on_cpu_only)


# The CPU flags (Linux's /proc/cpuinfo) of bfloat16 instructions, by the names vendors give them.
BFLOAT16_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


def cpu_bfloat16_extensions(cpuinfo: str = "/proc/cpuinfo") -> list:
    """The bfloat16 instructions this CPU has, by name ([] where none, or where the flags cannot be read)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [name for flag, name in BFLOAT16_FLAGS.items() if flag in flags]


def precision_note(precision: str):
    """A line for a float32 run on a CPU with bfloat16 instructions and no accelerator, where
    mixed_bfloat16 trains much faster (docs/benchmarks.md, "bfloat16 on a CPU"); else None.
    The default stays float32: a run's numbers should not depend on the machine it starts on."""
    if precision != "float32" or tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        return None
    found = cpu_bfloat16_extensions()
    if not found:
        return None
    return (f"precision float32; this CPU has {' and '.join(found)}: --precision mixed_bfloat16 trained ViT-S/16 "
            f"1.7x faster than float32 on one (docs/benchmarks.md, \"bfloat16 on a CPU\")")


def describe_strategy(config, strategy):
    """What the plan records of the run's `strategy`: (resolved name, replicas, whether the step
    is XLA-compiled, this process's input shard (index, count), whether it is the chief)."""
    name = resolve_name(config.strategy, config.tpu)
    return (name, strategy.num_replicas_in_sync, resolve_jit_compile(config, strategy), input_shard(strategy),
            is_chief(strategy))


def make_strategy(name: str = "auto", tpu=None) -> tf.distribute.Strategy:
    name = resolve_name(name, tpu)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        if _cluster_size() < 1:
            raise UserError("strategy 'multi_worker' needs TF_CONFIG describing the cluster and this task.")
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or os.environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise UserError(f"Unknown strategy {name!r}.")


def input_shard(strategy):
    """(index, count) of this process among the input pipelines (one per worker): each worker
    checks only its own part of a folder's files."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    chiefs = len(cluster.get("chief", []))
    if resolver.task_type == "chief":
        return 0, chiefs + len(cluster.get("worker", []))
    return chiefs + int(resolver.task_id), chiefs + len(cluster.get("worker", []))


def is_chief(strategy) -> bool:
    """Whether this process writes checkpoints, logs and results."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0
                                                          and "chief" not in resolver.cluster_spec().as_dict())
