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
from typing import Tuple

import tensorflow as tf

from keras_vit.errors import UserError
from keras_vit.training.config import CONCRETE_PRECISIONS


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


# The CPU flags (Linux's /proc/cpuinfo) of bfloat16 instructions, by the names vendors give them, and the
# lowest ONEDNN_MAX_CPU_ISA under which oneDNN still uses each (a lower cap leaves it unused).
BFLOAT16_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
_ONEDNN_ISA_RANKS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                     "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX",
                     "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
                     "AVX10_2_512_AMX_2")
_LOWEST_ISA = {"AVX512-BF16": "AVX512_CORE_BF16", "AMX-BF16": "AVX512_CORE_AMX"}
PRECISION_ENV = "KERAS_VIT_PRECISION"  # what --precision auto picks on this machine, where set


def cpu_bfloat16_extensions(cpuinfo: str = "/proc/cpuinfo") -> list:
    """The bfloat16 instructions this CPU has and oneDNN may use, by name ([] where none, where the
    flags cannot be read, or where TensorFlow's oneDNN kernels are off)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false"):
        return []  # TensorFlow's own kernels, which compute bfloat16 slower than float32
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    rank = _ONEDNN_ISA_RANKS.index(cap) if cap in _ONEDNN_ISA_RANKS else len(_ONEDNN_ISA_RANKS)
    return [name for flag, name in BFLOAT16_FLAGS.items()
            if flag in flags and rank >= _ONEDNN_ISA_RANKS.index(_LOWEST_ISA[name])]


def machine_precision(tpu: bool = False) -> Tuple[str, str]:
    """(precision, why): what `--precision auto` picks for a new run on this machine, the faster one
    where its units compute in bfloat16 (docs/benchmarks.md, "bfloat16 on a CPU"). KERAS_VIT_PRECISION
    pins it (a cluster, a CI job: runs that must not depend on the machine they start on)."""
    pinned = os.environ.get(PRECISION_ENV)
    if pinned:
        if pinned not in CONCRETE_PRECISIONS:
            raise UserError(f"{PRECISION_ENV}={pinned!r} is not a precision: give one of "
                            f"{', '.join(CONCRETE_PRECISIONS)}, or unset it to pick by machine.")
        return pinned, f"{PRECISION_ENV} says so"
    if tpu:
        return "mixed_bfloat16", "a TPU's matrix units compute in bfloat16"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capability = min(tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability") or (0, 0))
                         for gpu in gpus)
        named = "this GPU" + (f" (compute capability {capability[0]}.{capability[1]})" if capability[0] else "")
        if capability >= (8, 0):
            return "mixed_bfloat16", f"{named} has bfloat16 tensor cores"
        # Volta and Turing (7.x) have float16 tensor cores only.
        tip = (" (--precision mixed_float16 runs on its float16 ones, with loss scaling)"
               if capability >= (7, 0) else "")
        return "float32", f"{named} has no bfloat16 tensor cores{tip}"
    found = cpu_bfloat16_extensions()
    if found:
        return "mixed_bfloat16", (f"this CPU has {' and '.join(found)}, where ViT-S/16 trained 1.7x faster than in "
                                  f"float32 (docs/benchmarks.md, \"bfloat16 on a CPU\"); --precision float32 keeps "
                                  f"float32")
    return "float32", "this CPU has no bfloat16 instructions"


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
