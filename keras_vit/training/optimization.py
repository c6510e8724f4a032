"""Learning-rate schedules and optimizers of the recipes."""

from __future__ import annotations

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak` over `warmup_steps`, then "cosine" or
    "linear" decay to 0 at `total_steps`, or "constant"."""

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine"):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = ops.minimum(1.0, (step + 1.0) / max(1, self.warmup_steps)) if self.warmup_steps else 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        if self.decay == "cosine":
            factor = 0.5 * (1.0 + ops.cos(math.pi * progress))
        elif self.decay == "linear":
            factor = 1.0 - progress
        else:
            factor = 1.0
        return self.peak * warmup * factor

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay": self.decay}


def make_optimizer(recipe, precision="float32"):
    """The recipe's optimizer. Clipping is not set here: the trainer clips the
    all-reduced gradient itself (Keras would clip each replica's part)."""
    schedule = WarmupSchedule(recipe.learning_rate, recipe.warmup_steps, recipe.steps, recipe.schedule)
    if recipe.optimizer == "sgd":
        if recipe.weight_decay:
            optimizer = keras.optimizers.SGD(schedule, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
        else:
            optimizer = keras.optimizers.SGD(schedule, momentum=recipe.momentum)
    elif recipe.optimizer == "adam" and not recipe.weight_decay:
        optimizer = keras.optimizers.Adam(schedule, beta_1=recipe.momentum, beta_2=recipe.beta_2)
    else:
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=recipe.weight_decay,
                                           beta_1=recipe.momentum, beta_2=recipe.beta_2)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
