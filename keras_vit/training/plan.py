"""A run's plan: everything derived from the config, the data and the strategy, resolved once.

    plan = plan_run(config, task, dataset)               # what the trainer does, once
    plan = resolve(config, source, initial_weights, num_replicas=2)

The data pipeline, the compiled steps, the optimizer, the progress report and
the checkpoint fingerprint read the plan and nothing else, so two places can
no longer disagree about a batch size, a step count or an augmentation. The
plan is written into the run folder's config.json ("plan"): what actually
trained, beside what was asked for.

What is resolved here:
  * batches: global, per replica, micro (per replica and accumulation step)
    and evaluation, with every divisibility check;
  * length: steps (from --epochs and the training split's size when the
    recipe counts epochs) and the warmup (from warmup_epochs the same way);
    a warning when the warmup takes more than half of the run;
  * the augmentation level (AugReg's "by_size" from the model) and the
    training augmentation as an ordered list of ops (crop, flip, RandAugment,
    the scale to the model's pixel normalisation, erasing, then mixing),
    which keras_vit.training.augment applies;
  * the model config (the variant or the weights' own architecture, with
    the user's patch size, position embedding and classifier, the recipe's
    classifier from scratch, its representation layer and regularisation),
    image size, channels, classes, the Task (an injected one checked like
    any other) and its fields, XLA, precision, the strategy, steps per host
    loop and evaluation steps;
  * `plan_run` also resolves the Task, the initial weights and the data
    source, in that order (the refusals of the architecture before the
    data opens), and the plan holds them.

The trainer builds what the plan says and derives none of it again;
config.json holds the settings as given and the plan, once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Tuple, Union

from keras_vit.utils import console as _console
from keras_vit.config import DEFAULT_LORA_TARGETS, ViTConfig
from keras_vit.errors import UserError
from keras_vit.tasks import Task, make_task, task_class, task_name
from keras_vit.tasks.fields import kind_names
from keras_vit.training.config import AUG_LEVELS, CONCRETE_PRECISIONS, RECIPES, Recipe, TrainConfig
from keras_vit.training.memory import estimate
from keras_vit.training.sources.source import HELD_OUT_EVERY
from keras_vit.variants import get_variant

# train_augment -> its geometric ops, in order (every image ends at the plan's size).
GEOMETRY = {
    "inception_crop_flip": ("inception_crop", "flip"),
    "inception_crop": ("inception_crop",),
    "flip": ("resize", "flip"),
    "affine": ("resize", "affine"),
    "translate": ("resize", "translate"),
    "none": ("resize",),
}
arg = _console.argument  # a flag on the command line, a keyword in Python
WARMUP_WARN_FRACTION = 0.5  # a warmup longer than this fraction of the run is named in a warning


@dataclasses.dataclass(frozen=True)
class Plan:
    """One run, resolved (see the module docstring). `config` is the run's
    TrainConfig with its recipe resolved: steps and warmup in steps, the
    augmentation level's RandAugment and Mixup filled in."""

    config: TrainConfig
    task: Task  # what is learned; config.json records its name (keras_vit.tasks.task_name)
    model: ViTConfig
    image_size: Tuple[int, int]
    num_channels: int
    num_classes: int
    num_replicas: int
    num_input_pipelines: int
    global_batch: int
    per_replica_batch: int
    micro_batch: int  # per replica and accumulation step
    accum_steps: int
    eval_batch: int  # global
    eval_steps: int  # batches of eval_batch covering the evaluation split
    steps_per_loop: int  # optimizer steps per call into the device
    steps: int
    warmup_steps: int
    train_size: Optional[int]
    augmentation: Tuple[dict, ...]  # per-example ops, in order
    mixing: Optional[dict]  # Mixup/CutMix of pairs of the stream, after the per-example ops
    jit_compile: bool
    precision: str
    remat: bool
    strategy: str  # the resolved name (keras_vit.training.strategies)
    shuffle: str  # how the training stream is shuffled: the source's Source.shuffle_kind
    warnings: Tuple[str, ...] = ()
    precision_why: str = ""  # how --precision auto chose (resolve_precision); "" where it was given
    source: Any = dataclasses.field(default=None, compare=False)  # the data (plan_run's; not in config.json)
    initial: Any = dataclasses.field(default=None, compare=False)  # the initial weights, or None (idem)
    distribution: Any = dataclasses.field(default=None, compare=False)  # the tf.distribute.Strategy (idem)
    chief: bool = dataclasses.field(default=True, compare=False)  # this process writes the run folder (idem)

    @property
    def memory(self):
        """The training step's memory by estimate (keras_vit.training.memory.StepMemory)."""
        return estimate(self.model, self.image_size, self.num_classes, self.num_channels, self.micro_batch,
                        self.recipe.optimizer, self.precision, self.remat)

    @property
    def fields(self):
        """The fields of an example ({name: keras_vit.tasks.fields.FieldKind}): the Task's."""
        return self.task.fields

    @property
    def recipe(self):
        """The resolved recipe (config.recipe)."""
        return self.config.recipe

    @property
    def pixel_normalization(self) -> str:
        """What the model takes after pixels 0..255 are scaled (its
        ViTConfig.pixel_normalization, keras_vit.images.NORMALIZATIONS): the
        training op "to_model_range" and evaluation scale to it."""
        return self.model.pixel_normalization

    @property
    def steps_per_epoch(self) -> Optional[float]:
        """Optimizer steps in one pass over the training split; None where its size is unknown."""
        return self.train_size / self.global_batch if self.train_size else None

    def to_dict(self) -> dict:
        """JSON-ready: config.json's "plan"."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("config", "source", "initial", "distribution", "chief")}
        out["task"] = task_name(self.task)
        out["fields"] = kind_names(self.fields)
        out["model"] = self.model.to_dict()
        out["image_size"] = list(self.image_size)
        out["augmentation"] = [dict(op) for op in self.augmentation] + ([{"op": "mix", **self.mixing}]
                                                                        if self.mixing else [])
        out.pop("mixing")
        out["warnings"] = list(self.warnings)
        out["recipe"] = {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in dataclasses.asdict(self.recipe).items()}
        out["peak_learning_rate"] = self.recipe.peak_learning_rate
        return out


def plan_run(config: TrainConfig, task: Optional[Task] = None, dataset=None) -> Plan:
    """The whole run resolved once, for the trainer: the strategy (first:
    MultiWorkerMirroredStrategy wants to exist before other TF work), this
    process's input shard and role, the Task (`task`, else the one config asks
    for), the initial weights, the model config (its refusals before the data
    opens), the data (config.dataset, or `dataset`), XLA, then everything
    `resolve` derives (the step's memory among it). The plan holds the
    strategy, the source and the weights."""
    from keras_vit.training import strategies
    from keras_vit.training.data import open_source
    from keras_vit.training.transfer import resolve_weights

    distribution = strategies.make_strategy(config.strategy, config.tpu)
    # Before XLA is resolved (the step compiler follows the precision) and before the model's refusals.
    config, precision_why = resolve_precision(config)
    name, num_replicas, jit_compile, shard, chief = strategies.describe_strategy(config, distribution)
    task = task or make_task(config)
    # A classifier on a transformers base is that family's image classifier (a new head:
    # what its pooling reads), so its peft adapter gives transformers the run's logits.
    initial = resolve_weights(config.weights, new_head=task.reads_classifier_head)
    model = model_config(config, initial, task)
    source = open_source(config, dataset, shard=shard, fields=task.fields)
    plan = _derive(config, source, initial, task, model, num_replicas, shard[1], jit_compile, name)
    return dataclasses.replace(plan, distribution=distribution, chief=chief, precision_why=precision_why)


def resolve(config: TrainConfig, source, initial=None, num_replicas: int = 1, num_input_pipelines: int = 1,
            jit_compile: bool = False, task: Union[Task, str, None] = None, strategy: Optional[str] = None,
            model: Optional[ViTConfig] = None) -> Plan:
    """The plan of `config` on `source` (a keras_vit.training.sources.Source),
    starting from `initial` (keras_vit.training.transfer.resolve_weights' weights,
    or None: from scratch), over `num_replicas` replicas of the `strategy`
    (its resolved name; None: config.strategy as given) with `jit_compile`
    (keras_vit.training.strategies.resolve_jit_compile for that strategy), training
    `task` (a Task, a name, or None: the one config asks for). `model`: the
    model config when already resolved (model_config). Raises UserError, one
    line naming the fix, on a bad combination."""
    config, precision_why = resolve_precision(config, strategy)
    task = _task(config, task)
    model = model or model_config(config, initial, task)
    plan = _derive(config, source, initial, task, model, num_replicas, num_input_pipelines, jit_compile,
                   strategy or config.strategy)
    return dataclasses.replace(plan, precision_why=precision_why)


def resolve_precision(config: TrainConfig, strategy: Optional[str] = None) -> Tuple[TrainConfig, str]:
    """(config with its precision resolved, how): "auto" is the precision the run in config.workdir
    began with (config.json's plan), so that a run resumed on another machine keeps its numbers;
    for a new run, the machine's faster one (keras_vit.training.strategies.machine_precision) under
    `strategy` (a name; None: config.strategy)."""
    if config.precision != "auto":
        return config, ""
    from keras_vit import runs
    from keras_vit.training import strategies

    on_tpu = strategies.resolve_name(strategy or config.strategy, config.tpu) == "tpu"
    here, why = strategies.machine_precision(on_tpu)
    recorded = runs.read_config(config.workdir).get("plan")
    recorded = recorded.get("precision") if isinstance(recorded, dict) else None
    if recorded in CONCRETE_PRECISIONS:
        return (dataclasses.replace(config, precision=recorded),
                "the run's own, as it began (config.json), so that it resumes exactly"
                + ("" if here == recorded else f"; a new run here would take {here}: {why}"))
    return dataclasses.replace(config, precision=here), why


def _derive(config, source, initial, task, model, num_replicas, num_input_pipelines, jit_compile, strategy) -> Plan:
    """Everything else, from the Task, the model config and the data (resolve's one body)."""
    recipe = with_aug_level(config.recipe, model)
    _check_fields(task, source, recipe)
    train_size = source.sizes.get(source.train_split)
    global_batch = recipe.batch_size
    check_batch(global_batch, num_replicas, config.accum_steps)
    steps = _steps(recipe, train_size, source.name)
    warmup_steps = _warmup_steps(recipe, train_size, source.name)
    recipe = dataclasses.replace(recipe, steps=steps, warmup_steps=warmup_steps)
    image_size = _image_size(recipe, source)
    _check_patch_grid(image_size, model, _size_origin(config.recipe, source))
    per_replica = global_batch // num_replicas
    eval_batch = _eval_batch(config.eval_batch_size or global_batch // config.accum_steps, num_replicas)
    channels = int(initial.num_channels if initial is not None else source.num_channels)
    # A loss over every replica's examples gathers them: a collective an XLA program on one device cannot
    # hold, nor a loop over micro-batches.
    gathers = task.gathers_across_replicas and num_replicas > 1
    if gathers and config.accum_steps > 1:
        raise UserError(f"The {task.name} task's loss reads every replica's examples, which a step accumulated "
                        f"over micro-batches cannot gather: give {arg('accum_steps', 1)} (and a batch that fits), "
                        f"or train on one replica.")
    return Plan(
        config=dataclasses.replace(config, recipe=recipe), task=task, model=model, image_size=image_size,
        num_channels=channels,
        num_classes=int(source.num_classes), num_replicas=num_replicas, num_input_pipelines=num_input_pipelines,
        global_batch=global_batch, per_replica_batch=per_replica, micro_batch=per_replica // config.accum_steps,
        accum_steps=config.accum_steps, eval_batch=eval_batch, eval_steps=eval_steps(source, eval_batch),
        steps_per_loop=config.steps_per_loop or config.log_every, steps=steps, warmup_steps=warmup_steps,
        train_size=train_size, augmentation=augmentation_ops(recipe, model.pixel_normalization),
        mixing=mixing(recipe), jit_compile=bool(jit_compile) and not gathers, precision=config.precision,
        remat=config.remat,
        strategy=strategy, shuffle=source.shuffle_kind,
        warnings=tuple(_warnings(recipe, train_size)), source=source, initial=initial)


def eval_steps(source, global_batch: int) -> int:
    """Batches of `global_batch` covering the evaluation split (every worker runs as many)."""
    size = source.sizes.get(source.eval_split)
    if not size:
        give = {"list": "give an evaluation list (list:TRAIN,EVAL)",
                "dataset": "give dataset=(train, eval)"}.get(source.name.split(":")[0],
                                                              "add a val/ folder (PATH/train + PATH/val)")
        held_out = (f" Without an evaluation split every {HELD_OUT_EVERY}th image of each class is held out: give "
                    f"each class at least {HELD_OUT_EVERY} images, or {give}." if source.eval_split == "eval" else "")
        raise UserError(f"{source.name}: the evaluation split {source.eval_split!r} is empty or of unknown size."
                        + held_out)
    return math.ceil(size / global_batch)


def _task(config, task) -> Task:
    if task is None:
        return make_task(config)
    return task_class(task).from_train_config(config) if isinstance(task, str) else task


def _check_fields(task: Task, source, recipe) -> None:
    """The data gives every field the Task reads, and Mixup/CutMix only mixes fields that mix."""
    missing = [name for name in task.fields if name not in source.fields]
    if missing:
        raise UserError(f"The {task.name} task reads the field(s) {', '.join(missing)} of each example, and "
                        f"{source.name} gives {', '.join(source.fields)}: give data with them (a list: CSV with "
                        f"a column of each name, a dataset= of dicts with those keys).")
    unmixable = [f"{name} ({kind.name})" for name, kind in task.fields.items() if not kind.mixable]
    if recipe.mixes and unmixable:
        raise UserError(f"Mixup/CutMix mixes whole examples, and the {task.name} task's {', '.join(unmixable)} "
                        f"cannot be mixed: give {arg('mixup', 0)} and {arg('cutmix', 0)}.")


# --- the model ---------------------------------------------------------------------------

def model_config(config: TrainConfig, initial=None, task: Optional[Task] = None) -> ViTConfig:
    """The ViTConfig to build: the variant (or the weights' own architecture)
    with the user's patch size, position embedding and classifier (each
    refused where it contradicts pre-trained weights), the recipe's classifier
    when training from scratch, and the recipe's representation layer and
    regularisation. `task`: the Task the run trains, which the LoRA refusal
    reads: an injected Task is checked like any other (None: checked as a classifier)."""
    base = _base_model_config(config, initial)
    for field in ("patch_size", "position_embedding", "classifier"):
        base = _chosen(base, field, getattr(config, field), initial)
    recipe = config.recipe
    representation = (base.representation_size or base.hidden_size) if recipe.representation_layer else None
    if initial is not None and initial.source_config is not None and base.representation_size is None:
        # Weights with an architecture of their own (a checkpoint folder, a .keras run) and no
        # representation layer: a pre-training recipe's would start untrained on trained features.
        representation = None
    if initial is None and config.classifier is None and recipe.classifier is not None:
        base = base.replace(classifier=recipe.classifier)  # the recipe's, from scratch only
    _check_lora(config, initial, task)
    return base.replace(representation_size=representation, dropout_rate=recipe.dropout_rate,
                        stochastic_depth_rate=recipe.stochastic_depth_rate, patch_dropout=recipe.patch_dropout,
                        lora_rank=config.lora_rank, lora_alpha=config.lora_alpha, lora_targets=config.lora_targets)


def _check_lora(config: TrainConfig, initial, task: Optional[Task]) -> None:
    """LoRA adapts pre-trained weights of an encoder: refused from scratch and for a
    Task that trains its whole encoder (Task.adapts_encoder; the model's own checks
    refuse a rank that does not fit)."""
    flag = _console.either("--lora-rank", "lora_rank")
    quantized = initial is not None and initial.source_config is not None and initial.source_config.quantization
    if quantized == "int8" and config.precision == "mixed_float16":
        raise UserError(f"An int8 base cannot run under {arg('precision', 'mixed_float16')}: Keras' int8 layers "
                        f"sum their products in float16, which overflows. Use {arg('precision', 'mixed_bfloat16')} "
                        f"or float32.")
    if quantized and not config.lora_rank:
        raise UserError(f"The weights ({initial.description}) are {quantized}, and integer weights do not train: "
                        f"fine-tune them with LoRA (add {arg('lora_rank', 8)}: QLoRA), or start from the float "
                        f"model they were quantised from.")
    if not config.lora_rank:
        chosen = [name for name, value, default in (("lora_alpha", config.lora_alpha, None),
                                                    ("lora_targets", config.lora_targets, DEFAULT_LORA_TARGETS))
                  if value != default]
        if chosen:
            names = " and ".join(_console.either("--" + n.replace("_", "-"), n) for n in chosen)
            verb, pronoun = ("has", "it") if len(chosen) == 1 else ("have", "them")
            raise UserError(f"{names} {verb} no effect without {flag}: add {arg('lora_rank', 8)} (for example), "
                            f"or leave {pronoun} out.")
        return
    if initial is None:
        raise UserError(f"{flag} adapts pre-trained weights, and this run has none: add "
                        f"{arg('weights', 'imagenet21k')} (or a checkpoint folder, a run), or train every weight "
                        f"without {flag}.")
    if task is not None and not task.adapts_encoder:
        raise UserError(f"{flag} fine-tunes a classifier; the {task.name} task trains the whole encoder: drop "
                        f"{flag}, or fine-tune the result of this run with it.")


def _chosen(base: ViTConfig, field: str, value, initial) -> ViTConfig:
    """`base` with the user's `value` of an architecture `field` (None: not chosen);
    pre-trained weights fix their own, so a different value is refused."""
    if value is None or value == getattr(base, field):
        return base
    if initial is not None:
        flag = _console.either("--" + field.replace("_", "-"), field)
        raise UserError(f"{arg(field, value)} contradicts the pre-trained weights ({initial.description}), whose "
                        f"{field.replace('_', ' ')} is {getattr(base, field)!r}: drop {flag}, or train from "
                        f"scratch without {_console.either('--weights', 'weights')}.")
    return base.replace(**{field: value})


def _base_model_config(config, initial) -> ViTConfig:
    """The variant named by --model, or the architecture of the weights (which must agree)."""
    if config.model is None:
        if initial is None or initial.source_config is None:
            raise UserError(f"Name a model ({arg('model', 'B/16')}, for example), or give "
                            f"{_console.either('--weights', 'weights')} that carry their own architecture (a "
                            f"checkpoint folder, hf:ORG/NAME, a .keras file, a workdir).")
        return initial.source_config
    base = get_variant(config.model)
    source = initial.source_config if initial is not None else None
    if source is None:
        return base
    # A .keras model or workdir: its architecture is what loads.
    sizes = ("hidden_size", "num_layers", "num_heads", "mlp_dim")
    if any(getattr(source, k) != getattr(base, k) for k in sizes) or (source.resnet is None) != (base.resnet is None):
        raise UserError(f"{arg('model', config.model)} does not match the architecture of the weights "
                        f"({initial.description}): leave {_console.either('--model', 'model')} out to take "
                        f"the weights' own.")
    return source


def aug_level_by_size(model) -> str:
    """big_vision's choice per model size: light1 for Ti (width 192) and
    smaller, light2 for S/32, medium2 for S/16 and larger. A variant name in
    any spelling the variant table takes, or a ViTConfig."""
    config = get_variant(model) if isinstance(model, str) else model
    width, patch = getattr(config, "hidden_size", None), getattr(config, "patch_size", None)
    if width is not None and width <= 192:
        return "light1"
    return "light2" if (width, patch) == (384, 32) else "medium2"


def with_aug_level(recipe: Recipe, model) -> Recipe:
    """The recipe with its augmentation level resolved ("by_size" by `model`)
    and the level's RandAugment and Mixup filled in where the recipe leaves
    them None (an explicit --randaugment / --mixup wins). The one place a
    level is read: the run's plan calls it, so every way of building a
    config trains the same run."""
    level = recipe.aug_level
    if level == "by_size":
        level = aug_level_by_size(model)
    settings = AUG_LEVELS.get(level, {}) if level is not None else {}
    randaugment = recipe.randaugment if recipe.randaugment is not None else settings.get("randaugment")
    mixup = recipe.mixup if recipe.mixup is not None else settings.get("mixup", 0.0)
    return dataclasses.replace(recipe, aug_level=level, randaugment=randaugment, mixup=mixup)


def augmentation_ops(recipe, normalization: str = "minus_one_to_one") -> Tuple[dict, ...]:
    """The per-example training ops of a resolved recipe, in the order they run.

    `normalization` (the model's ViTConfig.pixel_normalization): what the
    "to_model_range" op maps pixels 0..255 to (keras_vit.images.normalize).
    The op names it only when it is not the paper's [-1, 1], so that the plan
    of a model taking [-1, 1] reads as it always has."""
    ops = [{"op": name} for name in GEOMETRY[recipe.train_augment]]
    if recipe.randaugment and recipe.randaugment[0]:
        ops.append({"op": "randaugment", "num_ops": recipe.randaugment[0], "magnitude": recipe.randaugment[1]})
    ops.append(model_range_op(normalization))
    if recipe.random_erasing:
        ops.append({"op": "random_erasing", "probability": recipe.random_erasing})
    return tuple(ops)


def model_range_op(normalization: str = "minus_one_to_one") -> dict:
    """The op scaling pixels 0..255 to what the model takes (its pixel normalisation)."""
    if normalization == "minus_one_to_one":
        return {"op": "to_model_range"}
    return {"op": "to_model_range", "normalization": normalization}


def mixing(recipe) -> Optional[dict]:
    """Mixup/CutMix settings, or None: pairs (j, j + K) in groups of 2K
    consecutive examples of the stream, K the repeated-augmentation count."""
    if not recipe.mixes:
        return None
    return {"mixup": float(recipe.mixup or 0.0), "cutmix": float(recipe.cutmix), "prob": recipe.mix_prob,
            "switch_prob": recipe.mix_switch_prob, "partner_offset": recipe.repeated_augmentation}


# --- the checks and conversions -----------------------------------------------------------

def check_batch(batch: int, replicas: int, accum: int) -> None:
    """The global batch splits into replicas x accumulation steps (the one rule; the command line
    checks it with one replica before TensorFlow starts)."""
    if batch % (replicas * accum):
        multiple = replicas * accum
        nearest = max(multiple, batch // multiple * multiple)
        raise UserError(f"{arg('batch_size', batch)} must be a multiple of replicas ({replicas}) x "
                        f"{arg('accum_steps', accum)} = {multiple}: use {arg('batch_size', nearest)}.")


def _steps(recipe, train_size, name) -> int:
    if not recipe.epochs:
        return recipe.steps
    if not train_size:
        raise UserError(f"{name}: the size of the training split is unknown, so {arg('epochs', recipe.epochs)} "
                        f"(the {recipe.name} recipe counts epochs) cannot be turned into steps: give "
                        f"{_console.either('--steps N', 'steps=N')}.")
    return max(1, math.ceil(recipe.epochs * train_size / recipe.batch_size))


def _warmup_steps(recipe, train_size, name) -> int:
    if recipe.warmup_epochs is None:
        return recipe.warmup_steps
    if not train_size:
        raise UserError(f"{name}: the size of the training split is unknown, so the warmup of "
                        f"{recipe.warmup_epochs:g} epochs cannot be turned into steps: give "
                        f"{_console.either('--warmup-steps N', 'warmup_steps=N')}.")
    return int(round(recipe.warmup_epochs * train_size / recipe.batch_size))


def _warnings(recipe, train_size):
    out = []
    if recipe.warmup_steps > WARMUP_WARN_FRACTION * recipe.steps:
        out.append(f"the warmup ({recipe.warmup_steps} steps) takes more than half of the run ({recipe.steps} "
                   f"steps): the learning rate reaches its peak late or never; give "
                   f"{arg('warmup_steps', recipe.steps // 10)} (for example) or more steps.")
    if recipe.ema and recipe.ema < 1 and 1 / (1 - recipe.ema) > recipe.steps:
        span = int(round(1 / (1 - recipe.ema)))
        shorter = float(f"{1 - 10 / max(recipe.steps, 20):.2g}")
        out.append(f"the weight average ({arg('ema', recipe.ema)}) spans about {span:,} steps, more than the run "
                   f"({recipe.steps} steps): evaluation and model.keras would stay near the first weights; give "
                   f"{arg('ema', shorter)} or {arg('ema', 0)} (no average).")
    if train_size and recipe.batch_size > train_size:
        fits = 1 << max(0, int(train_size).bit_length() - 1)
        out.append(f"{arg('batch_size', recipe.batch_size)} is larger than the training set ({train_size} images): "
                   f"every step repeats images. A batch of {fits} or fewer fits the data.")
    return out


def _image_size(recipe, source) -> Tuple[int, int]:
    size = recipe.image_size or source.image_size
    if size is None:
        raise UserError(f"{source.name} has images of varying size: set the image size "
                        f"(e.g. {arg('image_size', 224)}).")
    return (size, size) if isinstance(size, int) else tuple(int(s) for s in size)


def _size_origin(recipe, source) -> Optional[str]:
    """Where an image size the user did not give comes from (None: the user gave it), so that
    a refusal does not quote --image-size back to a user who never typed it."""
    if recipe.image_size is None:
        return f"{source.name}'s image size"
    default = getattr(RECIPES.get(recipe.name), "image_size", None)
    return f"the {recipe.name} recipe's default image size" if recipe.image_size == default else None


def _check_patch_grid(image_size, model_config, origin=None):
    stride = model_config.total_stride
    if any(side % stride for side in image_size):
        fitting = tuple(max(stride, side // stride * stride) for side in image_size)
        given = arg("image_size", tuple(image_size)) if origin is None else f"{origin}, {'x'.join(map(str, image_size))},"
        raise UserError(f"{given} is not a multiple of the model's patch ({stride} px): use "
                        f"{arg('image_size', fitting)}.")


def _eval_batch(batch, replicas):
    return max(replicas, batch // replicas * replicas)
