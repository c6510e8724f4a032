"""Learning-rate schedules and optimizers of the recipes."""

from __future__ import annotations

import contextlib
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


def decays(variable) -> bool:
    """Whether weight decay applies: kernels only. Biases, norms, the position
    embedding, the class token and relative position tables are left alone,
    as big_vision (decay on ".*/kernel") and timm (no decay below 2-D) do."""
    return variable.name == "kernel"


def depth_of(variable, num_layers: int) -> int:
    """0 for what comes before the encoder (patch/ResNet embedding, class
    token, position embedding), i + 1 for encoder block i, num_layers + 1 for
    what follows it (final norm, pre-logits, head)."""
    parts = variable.path.split("/")
    for part in parts:
        if part.startswith("encoderblock_"):
            return int(part[len("encoderblock_"):]) + 1
    after = ("encoder_norm", "pre_logits", "head", "norm")
    return num_layers + 1 if any(p in after for p in parts) else 0


def layer_scales(variables, num_layers: int, rate: float) -> dict:
    """{variable path: learning-rate scale rate ** (num_layers + 1 - depth)}
    (BEiT's layer-wise decay: the head 1, the embeddings the lowest)."""
    return {v.path: rate ** (num_layers + 1 - depth_of(v, num_layers)) for v in variables}


def _scale_learning_rates(optimizer, scales: dict) -> None:
    """Makes this optimizer instance update each variable with the learning
    rate times its scale: Keras optimizers have one learning rate, and hand
    it to `update_step` per variable, so that is where it is scaled (the
    variable arrives as TensorFlow's, hence the optimizer's own key).
    Decoupled weight decay stays at the unscaled rate (timm scales it too)."""
    inner_update = optimizer.update_step

    def update_step(gradient, variable, learning_rate):
        scale = scales.get(optimizer._var_key(variable), 1.0)
        return inner_update(gradient, variable, learning_rate * scale if scale != 1.0 else learning_rate)

    optimizer.update_step = update_step


def make_optimizer(recipe, precision="float32", variables=(), num_layers=0):
    """The recipe's optimizer for `variables` (the model's trainable ones):
    weight decay on kernels only (`decays`), layer-wise learning rates with
    recipe.layer_decay, a moving average of the weights with recipe.ema
    (Keras' use_ema: the averages are optimizer variables, so checkpoints
    keep them). Clipping is not set here: the trainer clips the all-reduced
    gradient itself (Keras would clip each replica's part)."""
    schedule = WarmupSchedule(recipe.peak_learning_rate, recipe.warmup_steps, recipe.steps, recipe.schedule)
    ema = dict(use_ema=True, ema_momentum=recipe.ema) if recipe.ema else {}
    if recipe.optimizer == "sgd":
        if recipe.weight_decay:
            optimizer = keras.optimizers.SGD(schedule, momentum=recipe.momentum, weight_decay=recipe.weight_decay,
                                             **ema)
        else:
            optimizer = keras.optimizers.SGD(schedule, momentum=recipe.momentum, **ema)
    elif recipe.optimizer == "adam" and not recipe.weight_decay:
        optimizer = keras.optimizers.Adam(schedule, beta_1=recipe.momentum, beta_2=recipe.beta_2, **ema)
    else:
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=recipe.weight_decay,
                                           beta_1=recipe.momentum, beta_2=recipe.beta_2, **ema)
    if recipe.weight_decay:
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if not decays(v)])
    if recipe.layer_decay and recipe.layer_decay != 1:
        by_path = layer_scales(variables, num_layers, recipe.layer_decay)
        _scale_learning_rates(optimizer, {optimizer._var_key(v): by_path[v.path] for v in variables})
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


@contextlib.contextmanager
def averaged_weights(model, optimizer):
    """Inside, the model holds the optimizer's moving average of its weights
    (recipe.ema); on leaving, the trained weights come back. Without an
    average, the model as it is."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    # Keras fills the averages at the first applied step: before it they are zeros.
    if not getattr(inner, "use_ema", False) or int(inner.iterations.numpy()) == 0:
        yield model
        return
    trained = [v.numpy() for v in model.trainable_variables]
    inner.finalize_variable_values(model.trainable_variables)
    try:
        yield model
    finally:
        for variable, value in zip(model.trainable_variables, trained):
            variable.assign(value)
