"""How much memory a training step needs, before anything is built.

    state  = parameters x (weights + gradients + optimizer slots) x 4 bytes
    images = micro-batch per replica x activations of one image
    total  = state + images + runtime

Activations of one image: each encoder block keeps about
tokens x (10 D + 2 M) values (the residual stream, norms, q/k/v, the MLP's
hidden layer) and 2 x heads x tokens^2 (attention scores and weights),
times ACTIVATION_FACTOR, fitted to the peak memory of B/16 and L/16 training
steps (float32, batch 8, 224 px; the measurements, their date and machine:
benchmarks/results_remat.md). Mixed precision keeps half the activation
bytes, --remat about half the activations (same page). A rough figure: the
trainer refuses a step only when it is far beyond the machine (REFUSE_ABOVE
x its memory), so the estimate need not be close.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from keras_vit.utils import console as _console

ACTIVATION_FACTOR = 2.2
RUNTIME_BYTES = 0.5e9  # TensorFlow, the input pipeline, XLA's own buffers
REFUSE_ABOVE = 1.5
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Estimated bytes of one training step on one replica."""

    state: float
    per_image: float
    images: int

    @property
    def total(self) -> float:
        return self.state + self.images * self.per_image + RUNTIME_BYTES


def estimate(model_config, image_size, num_classes, num_channels, micro_batch, optimizer, precision,
             remat=False) -> StepMemory:
    """The memory of a step of `micro_batch` images per replica (see the module docstring)."""
    d, m, layers, heads = (model_config.hidden_size, model_config.mlp_dim, model_config.num_layers,
                           model_config.num_heads)
    stride = model_config.total_stride
    tokens = (image_size[0] // stride) * (image_size[1] // stride) + 1
    params = (layers * (4 * d * d + 2 * d * m) + model_config.patch_size ** 2 * num_channels * d
              + tokens * d + d * num_classes)
    state = params * 4 * (2 + OPTIMIZER_SLOTS.get(optimizer, 2))
    per_block = tokens * (10 * d + 2 * m) + 2 * heads * tokens * tokens
    per_image = layers * per_block * 4 * ACTIVATION_FACTOR
    if precision != "float32":
        per_image /= 2
    if remat:
        per_image /= 2
    return StepMemory(state=state, per_image=per_image, images=micro_batch)


def machine_memory() -> Optional[float]:
    """The host's physical memory in bytes (None where it cannot be read)."""
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def gigabytes(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def ways_out(micro_batch: int) -> str:
    smaller = max(1, micro_batch // 4)
    n = micro_batch // smaller
    return (f"lower {_console.either('--batch-size', 'batch_size')}, or keep it and split each step with "
            f"{_console.argument('accum_steps', n)} ({n} micro-batches of {smaller} images per replica), "
            f"add {_console.argument('remat')} (about half the activations, for 1.2-1.3x the step time), "
            f"or pick a smaller {_console.either('--model', 'model')}")


def what_runs(plan) -> str:
    """The training step of `plan` in words, for the messages about its memory."""
    name = plan.config.model if isinstance(plan.config.model, str) else "the model"
    size = "x".join(str(s) for s in plan.image_size)
    return (f"a training step of {name} at {size} px, {plan.micro_batch} images per replica "
            f"at a time ({plan.num_replicas} replica(s)), {plan.precision}")


def check_fits(plan) -> None:
    """Before building: a step far beyond this machine's memory (plan.memory; CPU-only:
    accelerators report theirs only once used) is refused with the ways out."""
    import tensorflow as tf

    from keras_vit.errors import UserError

    available = machine_memory()
    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU") or not available:
        return
    if plan.memory.total > REFUSE_ABOVE * available:
        memory = plan.memory
        raise UserError(f"{what_runs(plan)} needs about {gigabytes(memory.total)} (weights, gradients and "
                        f"optimizer state {gigabytes(memory.state)}, activations {gigabytes(memory.per_image)} "
                        f"an image); this machine has {gigabytes(available)}: {ways_out(plan.micro_batch)}.")
