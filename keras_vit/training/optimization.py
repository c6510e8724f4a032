"""Learning-rate schedules and optimizers of the recipes."""

from __future__ import annotations

import contextlib
import math

import keras
import tensorflow as tf
from keras import ops

from keras_vit.errors import UserError
from keras_vit.model import text_towers_in, vits_in, weight_parts_of
from keras_vit.weights.parts import text_weight_parts, weight_parts


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


def decays(variable, parts=None) -> bool:
    """Whether weight decay applies to `variable`: kernels only (the part's
    rule, keras_vit.weights.parts; `parts`: {variable path: WeightPart}). A
    variable outside the ViT (a task's own head) by its name, the same rule."""
    part = (parts or {}).get(variable.path)
    return part.decays if part is not None else variable.name == "kernel"


def layer_scales(model, rate: float) -> dict:
    """{variable path: learning-rate scale} of BEiT's layer-wise decay:
    rate ** (num_layers + 1 - depth), depth from the parts description (the
    stem 0, block i i + 1, the head side num_layers + 1: final norm, MAP head,
    pooled norm, projection, pre-logits and heads all at the head's rate); an
    image-text model's text tower by the same rule over its own blocks.
    A task's wrapper around the ViT names its own stem-side layers in
    `stem_layers` (masked patch prediction's mask token: depth 0, as BEiT's);
    its other layers (the colour head) are its head: scale 1."""
    scales = {v.path: 1.0 for v in getattr(model, "trainable_variables", ())}
    vits = vits_in(model) if model is not None else []
    if model is not None and not vits:
        raise UserError(f"layer_decay needs a keras_vit.ViT in the model (its parts give each weight's depth); "
                        f"{model.name} holds none: train without layer_decay.")
    for vit in vits:
        num_layers = vit.config.num_layers
        for path, part in weight_parts(vit).items():
            scales[path] = rate ** (num_layers + 1 - part.depth(num_layers))
    for tower in text_towers_in(model) if model is not None else []:  # an image-text model's text tower: its own depth
        num_layers = tower.config.num_layers
        for path, part in text_weight_parts(tower).items():
            scales[path] = rate ** (num_layers + 1 - part.depth(num_layers))
    for layer in getattr(model, "stem_layers", ()):
        for variable in layer.trainable_variables:
            scales[variable.path] = rate ** (vits[0].config.num_layers + 1)
    return scales


class LayerDecay:
    """Layer-wise learning rates for a Keras optimizer class: mixed in before
    it (`class LayerDecaySGD(LayerDecay, keras.optimizers.SGD)`), each
    variable is updated with the learning rate times its scale in
    `layer_scales` ({variable path: scale}, from `layer_scales()`; 1 for a
    path not in it).

    Keras optimizers have one learning rate and hand it to `update_step` for
    each variable; overriding `update_step` is Keras' documented way to change
    an update rule, so the rate is scaled there and the base class' rule runs
    unchanged. Decoupled weight decay (AdamW's) is applied outside
    `update_step`, at the unscaled rate (timm scales it too)."""

    def __init__(self, *args, layer_scales=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_scales = dict(layer_scales or {})

    def build(self, variables):
        super().build(variables)
        self._scale_of = _scales_by_backing_variable(variables, self.layer_scales)

    def update_step(self, gradient, variable, learning_rate):
        key = variable.ref()
        if key not in self._scale_of:
            raise KeyError(f"{type(self).__name__} was not built for variable {variable.name}: build it inside "
                           f"the distribution strategy's scope, with the variables it updates.")
        scale = self._scale_of[key]
        return super().update_step(gradient, variable, learning_rate * scale if scale != 1.0 else learning_rate)

    def get_config(self):
        return {**super().get_config(), "layer_scales": dict(self.layer_scales)}


def _scales_by_backing_variable(variables, scales: dict) -> dict:
    """{TensorFlow variable ref: scale} of Keras variables: the TF optimizer
    hands `update_step` the TensorFlow variable behind a Keras variable
    (`Variable.value`), or under a mirrored strategy each replica's copy of
    it (the strategy's local results), never the Keras variable with its
    path."""
    strategy = tf.distribute.get_strategy()
    return {backing.ref(): scales.get(v.path, 1.0)
            for v in variables for backing in strategy.experimental_local_results(v.value)}


# The recipes' update rules with layer-wise rates, registered so that a saved
# optimizer config loads back (the trainer itself checkpoints variables only).
@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecaySGD(LayerDecay, keras.optimizers.SGD):
    """SGD with layer-wise learning rates (`LayerDecay`)."""


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecayAdam(LayerDecay, keras.optimizers.Adam):
    """Adam with layer-wise learning rates (`LayerDecay`)."""


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecayAdamW(LayerDecay, keras.optimizers.AdamW):
    """AdamW with layer-wise learning rates (`LayerDecay`)."""


WITH_LAYER_DECAY = {keras.optimizers.SGD: LayerDecaySGD, keras.optimizers.Adam: LayerDecayAdam,
                    keras.optimizers.AdamW: LayerDecayAdamW}


def rule_name(optimizer) -> str:
    """The Keras optimizer class whose update rule `optimizer` runs ("AdamW",
    "SGD"), with or without layer-wise rates and loss scaling: what a
    checkpoint's fingerprint records, so that runs checkpointed before the
    LayerDecay classes existed still resume."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return next(c for c in type(inner).__mro__ if not issubclass(c, LayerDecay)).__name__


def _update_rule(recipe):
    """(Keras optimizer class, its arguments besides the learning rate) of the recipe."""
    if recipe.optimizer == "sgd":
        # No weight_decay argument at all without decay: Keras would apply a decay of 0.
        decay = dict(weight_decay=recipe.weight_decay) if recipe.weight_decay else {}
        return keras.optimizers.SGD, dict(momentum=recipe.momentum, **decay)
    if recipe.optimizer == "adam" and not recipe.weight_decay:
        return keras.optimizers.Adam, dict(beta_1=recipe.momentum, beta_2=recipe.beta_2)
    return keras.optimizers.AdamW, dict(weight_decay=recipe.weight_decay, beta_1=recipe.momentum,
                                        beta_2=recipe.beta_2)


def make_optimizer(recipe, precision="float32", model=None):
    """The recipe's optimizer for `model`'s trainable variables: weight decay
    on kernels only (`decays`), layer-wise learning rates with
    recipe.layer_decay (`LayerDecay`, scales from `layer_scales`), a moving
    average of the weights with recipe.ema (Keras' use_ema: the averages are
    optimizer variables, so checkpoints keep them). Both read the model's
    parts (keras_vit.weights.parts). Clipping is not set here: the trainer
    clips the all-reduced gradient itself (Keras would clip each replica's part)."""
    schedule = WarmupSchedule(recipe.peak_learning_rate, recipe.warmup_steps, recipe.steps, recipe.schedule)
    ema = dict(use_ema=True, ema_momentum=recipe.ema) if recipe.ema else {}
    rule, arguments = _update_rule(recipe)
    if recipe.layer_decay and recipe.layer_decay != 1:
        scales = layer_scales(model, recipe.layer_decay)
        optimizer = WITH_LAYER_DECAY[rule](schedule, layer_scales=scales, **arguments, **ema)
    else:
        optimizer = rule(schedule, **arguments, **ema)
    if recipe.weight_decay:
        variables = model.trainable_variables if model is not None else []  # None: an optimizer to inspect
        parts = weight_parts_of(model) if model is not None else {}
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if not decays(v, parts)])
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
