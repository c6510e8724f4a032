"""What a training run is: a Recipe (the paper's hyper-parameters) inside a TrainConfig.

A recipe is a frozen dataclass of defaults; `TrainConfig.create("finetune",
learning_rate=0.01)` (or a `--learning-rate` flag) overrides any of its fields.
The three named recipes:

- "finetune" (paper, Sec. 4.1 / App. B.1.1): SGD momentum 0.9, no weight decay,
  500 warmup steps then cosine decay, batch 512, gradient clipping at global
  norm 1, Inception crop + horizontal flip for training, plain resize for
  evaluation, a zero-initialised head, no representation layer, and a higher
  resolution (384) than pre-training: the position embedding is resized when
  the pre-trained weights are loaded.
- "pretrain" (paper, App. B.1): Adam(0.9, 0.999), weight decay 0.1, batch
  4096, 10k linear warmup steps then linear decay, representation layer
  (pre-logits of width D) on, dropout 0.1, resolution 224.
- "scratch": a small-data recipe for training a small ViT from nothing on one
  CPU: AdamW (weight decay 0.05), 100 warmup steps + cosine, batch 128, 3,000
  steps, label smoothing 0.1, random rotation/zoom/shift, global-average-pool
  classifier. It is what the MNIST demo uses (96 epochs of 4,000 digits).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

from keras_vit.config import (CLASSIFIERS, DEFAULT_LORA_TARGETS, POSITION_EMBEDDINGS, ViTConfig, lora_alpha_value,
                               lora_targets)
from keras_vit.errors import UserError

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "linear", "constant")
AUGMENTATIONS = ("inception_crop_flip", "inception_crop", "flip", "affine", "translate", "none")
CONCRETE_PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
PRECISIONS = ("auto",) + CONCRETE_PRECISIONS  # auto: the machine's faster one (training.strategies.machine_precision)
LOSSES = ("softmax", "sigmoid")
STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")


# The AugReg paper's augmentation levels (big_vision vit_i1k.py): RandAugment and Mixup alpha.
AUG_LEVELS = {
    "none": dict(randaugment=None, mixup=0.0), "light1": dict(randaugment=(2, 0), mixup=0.0),
    "light2": dict(randaugment=(2, 10), mixup=0.2), "medium1": dict(randaugment=(2, 15), mixup=0.2),
    "medium2": dict(randaugment=(2, 15), mixup=0.5), "strong1": dict(randaugment=(2, 20), mixup=0.5),
    "strong2": dict(randaugment=(2, 20), mixup=0.8),
}



def _check_choice(field, value, choices):
    if value not in choices:
        raise UserError(f"{field} must be one of {choices}, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Hyper-parameters of one way of training (see the module docstring).

    Args:
        name: the recipe's name, recorded in results.json.
        optimizer: "sgd" (with `momentum`), "adam" (beta_1=`momentum`,
            `beta_2`; L2-free) or "adamw" (decoupled `weight_decay`).
        learning_rate: peak learning rate, reached after the warmup.
        momentum: SGD momentum, or Adam's beta_1.
        beta_2: Adam's beta_2.
        weight_decay: decoupled weight decay (Keras convention: each step
            subtracts learning_rate * weight_decay * w). With "adam" a
            non-zero value switches to AdamW.
        schedule: decay after the warmup: "cosine" or "linear" (to 0), or
            "constant".
        warmup_steps: linear warmup from 0 to `learning_rate`, in steps.
        warmup_epochs: the warmup in passes over the training split, as the
            papers state it (DeiT, BEiT, MAE: 5 epochs); the run's plan turns
            it into steps with the split's size, so it fits any dataset. Set,
            it wins over `warmup_steps`.
        steps: optimizer steps in the run.
        batch_size: the global batch of one optimizer step, over all replicas
            and all accumulation micro-steps.
        grad_clip_norm: clip the (all-reduced) gradient to this global norm;
            None disables clipping.
        label_smoothing: of the softmax cross-entropy.
        train_augment: "inception_crop_flip", "inception_crop", "flip",
            "affine" (rotation up to 15 degrees, zoom 1 +- 0.15, shift up to
            1/8 of the side), "translate" (mirror-pad by 1/8 of the side,
            random crop back) or "none".
            Evaluation always resizes only.
        image_size: training resolution; None keeps the dataset's own size.
        representation_layer: keep the pre-logits layer (Dense(D) + tanh) of
            pre-training; False drops it (fine-tuning).
        classifier: the classifier this recipe trains from scratch with
            ("token" / "gap"); None keeps the variant's. Pre-trained weights
            keep their own, and a user's choice is TrainConfig.classifier
            (--classifier), so the recipe's value is never mistaken for one.
        dropout_rate: ViT dropout (embedding, attention output, MLP).
        stochastic_depth_rate: drop-path rate of the last block.
        epochs: train for this many passes over the training split instead of
            `steps` (the steps are worked out once the split's size is known).
        lr_base_batch: scale `learning_rate` by batch_size / lr_base_batch
            (DeiT's rule: 5e-4 at 512); None uses `learning_rate` as given.
        ema: decay of an exponential moving average of the weights (e.g.
            0.9999); evaluation, model.keras and its exports use the average.
        layer_decay: learning-rate scale per depth: block i of L gets
            layer_decay ** (L - i), the embeddings layer_decay ** (L + 1),
            the head 1 (BEiT / MAE fine-tuning).
        loss: "softmax" (cross-entropy) or "sigmoid" (binary cross-entropy on
            the one-hot targets, head bias initialised to -log(num_classes)).
        randaugment: (number of ops, magnitude 0..30), e.g. (2, 15); None:
            the augmentation level's (`aug_level`), else off; (0, 0) off.
        mixup: Beta(alpha, alpha) of Mixup; 0 off; None: the augmentation
            level's (`aug_level`), else 0.
        cutmix: Beta(alpha, alpha) of CutMix; 0 off.
        mix_prob: probability that a pair of examples is mixed at all.
        mix_switch_prob: with both on, probability of CutMix instead of Mixup.
        random_erasing: probability of erasing one random box of an image.
        repeated_augmentation: each example appears this many times in an
            epoch (differently augmented), in place of others (an epoch keeps its length).
        patch_dropout: fraction of the patch tokens dropped at random in
            training (PatchDropout / FLIP); evaluation sees them all.
        aug_level: an AugReg augmentation level (AUG_LEVELS: none, light1,
            light2, medium1, medium2, strong1, strong2) that sets randaugment
            and mixup where they are None; "by_size" picks it from the model
            as big_vision does. Resolved by the run's plan
            (keras_vit.training.plan), however the config was built.
    """

    name: str
    optimizer: str
    learning_rate: float
    momentum: float = 0.9
    beta_2: float = 0.999
    weight_decay: float = 0.0
    schedule: str = "cosine"
    warmup_steps: int = 0
    warmup_epochs: Optional[float] = None
    steps: int = 10_000
    batch_size: int = 512
    grad_clip_norm: Optional[float] = 1.0
    label_smoothing: float = 0.0
    train_augment: str = "inception_crop_flip"
    image_size: Optional[int] = None
    representation_layer: bool = False
    classifier: Optional[str] = None
    dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    epochs: Optional[float] = None
    lr_base_batch: Optional[int] = None
    ema: Optional[float] = None
    layer_decay: Optional[float] = None
    loss: str = "softmax"
    randaugment: Optional[Tuple[int, int]] = None
    mixup: Optional[float] = None
    cutmix: float = 0.0
    mix_prob: float = 1.0
    mix_switch_prob: float = 0.5
    random_erasing: float = 0.0
    repeated_augmentation: int = 1
    patch_dropout: float = 0.0
    aug_level: Optional[str] = None

    def __post_init__(self):
        if self.randaugment is not None:
            object.__setattr__(self, "randaugment", tuple(int(v) for v in self.randaugment))
        self._check_regularisers()
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("train_augment", self.train_augment, AUGMENTATIONS)
        if self.steps < 0 or self.warmup_steps < 0 or self.batch_size < 1:
            raise UserError(f"Recipe needs steps >= 0, warmup_steps >= 0 and batch_size >= 1, got "
                            f"steps={self.steps}, warmup_steps={self.warmup_steps}, batch_size={self.batch_size}.")
        if self.learning_rate < 0 or self.weight_decay < 0:
            raise UserError("learning_rate and weight_decay must be >= 0.")
        if self.grad_clip_norm is not None and self.grad_clip_norm <= 0:
            raise UserError(f"grad_clip_norm must be positive or None, got {self.grad_clip_norm}.")
        sides = self.image_size if isinstance(self.image_size, (tuple, list)) else (self.image_size,)
        if self.image_size is not None and any(not isinstance(s, int) or s < 1 for s in sides):
            raise UserError(f"image_size must be a positive number of pixels (or None for the dataset's own "
                            f"size), got {self.image_size!r}.")

    def _check_regularisers(self):
        _check_choice("loss", self.loss, LOSSES)
        for field in ("ema", "layer_decay"):
            value = getattr(self, field)
            if value is not None and not 0 < value <= 1:
                raise UserError(f"{field} must be in (0, 1], got {value}.")
        for field in ("mix_prob", "mix_switch_prob", "random_erasing", "patch_dropout"):
            if not 0 <= getattr(self, field) <= 1:
                raise UserError(f"{field} must be in [0, 1], got {getattr(self, field)}.")
        if self.patch_dropout == 1:
            raise UserError("patch_dropout 1 would drop every patch; give a fraction below 1.")
        if (self.mixup or 0) < 0 or self.cutmix < 0 or self.repeated_augmentation < 1:
            raise UserError("mixup and cutmix must be >= 0 and repeated_augmentation >= 1.")
        if self.randaugment is not None and (len(self.randaugment) != 2 or self.randaugment[0] < 0
                                             or not 0 <= self.randaugment[1] <= 30):
            raise UserError(f"randaugment is (number of ops >= 0, magnitude 0..30), got {self.randaugment}.")
        if (self.epochs is not None and self.epochs <= 0) or (self.lr_base_batch is not None and self.lr_base_batch < 1):
            raise UserError("epochs must be > 0 and lr_base_batch >= 1.")
        if self.warmup_epochs is not None and self.warmup_epochs < 0:
            raise UserError(f"warmup_epochs must be >= 0, got {self.warmup_epochs}.")
        if self.aug_level is not None:
            _check_choice("aug_level", self.aug_level, tuple(AUG_LEVELS) + ("by_size",))

    @property
    def mixes(self) -> bool:
        """Whether pairs of examples are mixed (Mixup or CutMix)."""
        return ((self.mixup or 0) > 0 or self.cutmix > 0) and self.mix_prob > 0

    @property
    def peak_learning_rate(self) -> float:
        """learning_rate, scaled by batch_size / lr_base_batch when that is set."""
        scale = self.batch_size / self.lr_base_batch if self.lr_base_batch else 1.0
        return self.learning_rate * scale


FINETUNE = Recipe(
    name="finetune", optimizer="sgd", learning_rate=0.03, momentum=0.9, weight_decay=0.0,
    schedule="cosine", warmup_steps=500, steps=10_000, batch_size=512, grad_clip_norm=1.0,
    train_augment="inception_crop_flip", image_size=384, representation_layer=False,
)
PRETRAIN = Recipe(
    name="pretrain", optimizer="adamw", learning_rate=1e-3, momentum=0.9, beta_2=0.999,
    weight_decay=0.1, schedule="linear", warmup_steps=10_000,
    # 300 epochs of ImageNet-1k (1.28M images) at batch 4096.
    steps=93_750, batch_size=4096, grad_clip_norm=1.0, train_augment="inception_crop_flip",
    image_size=224, representation_layer=True, dropout_rate=0.1,
)
SCRATCH = Recipe(
    name="scratch", optimizer="adamw", learning_rate=2e-3, momentum=0.9, beta_2=0.999,
    weight_decay=0.05, schedule="cosine", warmup_steps=100, steps=3_000, batch_size=128,
    grad_clip_norm=1.0, label_smoothing=0.1, train_augment="affine", image_size=None,
    representation_layer=False, classifier="gap",
)
# Self-supervised masked patch prediction (paper Sec. 4.6, App. B.1.2): Adam,
# lr 2e-4, batch 4096, warmup then cosine; the task is training/tasks/masked_patch.py.
MASKED_PATCH = Recipe(
    name="masked_patch", optimizer="adam", learning_rate=2e-4, momentum=0.9, beta_2=0.999,
    weight_decay=0.0, schedule="cosine", warmup_steps=10_000, steps=1_000_000, batch_size=4096,
    grad_clip_norm=1.0, train_augment="inception_crop_flip", image_size=224,
    representation_layer=False, dropout_rate=0.0,
)
# ImageNet-1k's training split: big_vision states its warmups in steps of its
# batch at ImageNet size; below they are the epochs those steps cover, so that
# they fit a run on any dataset (the plan converts epochs to steps).
IMAGENET_TRAIN = 1_281_167

# AugReg (Steiner et al. 2021; big_vision configs/vit_i1k.py): Adam 1e-3, cosine
# after 10k warmup steps, batch 4096, 300 epochs, clip 1, Inception crop + flip
# at 224 and an augmentation level per model size (AUG_LEVELS; the plan reads
# "by_size": plan.aug_level_by_size). big_vision adds wd x schedule without the learning rate; Keras
# decays by learning rate x wd: its 1e-4 is 0.1 here.
AUGREG = Recipe(
    name="augreg", optimizer="adamw", learning_rate=1e-3, momentum=0.9, beta_2=0.999, weight_decay=0.1,
    schedule="cosine", warmup_epochs=10_000 * 4096 / IMAGENET_TRAIN, epochs=300, batch_size=4096,
    grad_clip_norm=1.0, train_augment="inception_crop_flip", image_size=224, representation_layer=True,
    classifier="token", aug_level="by_size",
)
# DeiT (Touvron et al. 2021, main.py defaults): AdamW 5e-4 x batch / 512, wd 0.05,
# 300 epochs with 5 of warmup at batch 1024, label smoothing 0.1, RandAugment
# m9, random erasing 0.25, Mixup 0.8 / CutMix 1.0 (switch 0.5), repeated
# augmentation x3, stochastic depth 0.1, EMA 0.99996, no clipping.
DEIT = Recipe(
    name="deit", optimizer="adamw", learning_rate=5e-4, lr_base_batch=512, momentum=0.9, beta_2=0.999,
    weight_decay=0.05, schedule="cosine", warmup_epochs=5, epochs=300, batch_size=1024,
    grad_clip_norm=None, label_smoothing=0.1, train_augment="inception_crop_flip", image_size=224,
    classifier="token", stochastic_depth_rate=0.1, randaugment=(2, 9), random_erasing=0.25, mixup=0.8,
    cutmix=1.0, repeated_augmentation=3, ema=0.99996,
)
# "Better plain ViT baselines" (Beyer et al. 2022; big_vision configs/vit_s16_i1k.py):
# S/16 with global average pooling (and sin-cos 2-D position embedding:
# --position-embedding sincos_2d), Adam 1e-3, batch 1024, 90 epochs, 10k
# warmup, cosine, clip 1, RandAugment(2, 10), Mixup 0.2.
PLAIN_BASELINE = Recipe(
    name="plain_baseline", optimizer="adamw", learning_rate=1e-3, momentum=0.9, beta_2=0.999, weight_decay=0.1,
    schedule="cosine", warmup_epochs=10_000 * 1024 / IMAGENET_TRAIN, epochs=90, batch_size=1024,
    grad_clip_norm=1.0, train_augment="inception_crop_flip", image_size=224, representation_layer=True,
    classifier="gap",
    randaugment=(2, 10), mixup=0.2,
)
# Fine-tuning after self-supervised pre-training (BEiT / MAE): AdamW 5e-4 x
# batch / 256, wd 0.05, layer decay 0.65, 100 epochs with 5 of warmup,
# RandAugment m9, Mixup 0.8 / CutMix 1.0, label smoothing 0.1, random erasing
# 0.25, stochastic depth 0.1, global average pooling, and an EMA of the weights.
FINETUNE_LD = Recipe(
    name="finetune_ld", optimizer="adamw", learning_rate=5e-4, lr_base_batch=256, momentum=0.9, beta_2=0.999,
    weight_decay=0.05, schedule="cosine", warmup_epochs=5, epochs=100, batch_size=1024,
    grad_clip_norm=None, label_smoothing=0.1, train_augment="inception_crop_flip", image_size=224,
    classifier="gap", stochastic_depth_rate=0.1, layer_decay=0.65, randaugment=(2, 9), random_erasing=0.25,
    mixup=0.8, cutmix=1.0, ema=0.9999,
)
# Contrastive image-text training (keras_vit.tasks.image_text) on captions: SigLIP's sigmoid loss
# (Zhai et al. 2023: AdamW, lr 1e-3, wd 1e-4, warmup then cosine; the logit scale and bias learned)
# and CLIP's softmax loss (Radford et al. 2021: AdamW, lr 5e-4, wd 0.2, beta_2 0.98; the
# temperature learned). Batches are large: a contrastive step learns from its negatives, every
# replica's. Images are cropped but not flipped (a caption may say "left"). From a checkpoint,
# give --learning-rate lower (1e-5).
SIGLIP = Recipe(
    name="siglip", optimizer="adamw", learning_rate=1e-3, momentum=0.9, beta_2=0.95, weight_decay=1e-4,
    schedule="cosine", warmup_steps=100, steps=2_000, batch_size=256, grad_clip_norm=1.0,
    train_augment="inception_crop", image_size=None, representation_layer=False, classifier="map",
)
CLIP = Recipe(
    name="clip", optimizer="adamw", learning_rate=5e-4, momentum=0.9, beta_2=0.98, weight_decay=0.2,
    schedule="cosine", warmup_steps=100, steps=2_000, batch_size=256, grad_clip_norm=1.0,
    train_augment="inception_crop", image_size=None, representation_layer=False, classifier="token",
)
RECIPES = {recipe.name: recipe for recipe in (FINETUNE, PRETRAIN, SCRATCH, MASKED_PATCH, AUGREG, DEIT,
                                              PLAIN_BASELINE, FINETUNE_LD, SIGLIP, CLIP)}

def _counted_in_one_unit(changes: dict) -> dict:
    """A run length or warmup given in steps replaces the recipe's in epochs
    (--steps on deit, --warmup-steps on augreg) and vice versa; the same
    rule for create() and replace()."""
    for steps, epochs in (("steps", "epochs"), ("warmup_steps", "warmup_epochs")):
        if steps in changes and epochs not in changes:
            changes[epochs] = None
    return changes


# The Recipe fields a flag or a keyword overrides. Not the classifier: the recipe's is its own
# default for training from scratch, the user's is TrainConfig.classifier (see Recipe).
RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe) if f.name not in ("name", "classifier"))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One run: what to train, on what, where, and how it is distributed.

    Args:
        model: a variant name ("B/16", "Mu/4") or a ViTConfig. None takes the
            architecture of `weights` when that is a `.keras` file or a workdir.
        patch_size: replaces the variant's patch size (training from scratch;
            pre-trained weights fix it).
        position_embedding: replaces the variant's position embedding
            (ViTConfig.position_embedding: learned_1d, learned_2d, sincos_2d,
            relative or none); training from scratch only: pre-trained
            weights fix it.
        classifier: replaces the variant's (and the recipe's) classifier,
            config.CLASSIFIERS ("token", "gap", ...); None: the recipe's,
            else the variant's. Pre-trained weights fix it: a choice that
            contradicts them is refused.
        dataset: "mnist5k" (bundled), "tfds:NAME" (or a prepared tfds
            directory, tfds:DATA_DIR/NAME/VERSION), "list:TRAIN[,EVAL]"
            (CSV/JSON rows of image path, label), "folder:PATH" (one
            sub-folder per class; PATH/train + PATH/val|validation|test if
            present, else a fixed 10% of each class is held out) or
            "tfrecord:DIR" (DIR/train*.tfrecord* and DIR/{validation,test,eval}*,
            tf.train.Example with "image" = encoded bytes, "label" = int64).
        workdir: checkpoints, TensorBoard logs, model.keras and results.json.
        recipe: a Recipe, or the name of one in RECIPES.
        weights: initial weights: an official checkpoint name or .npz (as
            keras_vit.ViT accepts), a `.keras` model, or a training workdir
            (its model.keras). The encoder is transferred and the head is new.
        data_dir: tfds data directory.
        num_classes: class count, needed only for TFRecords without labels.txt.
        train_split: tfds split to train on.
        eval_split: tfds split to evaluate on; None: the first of
            "validation"/"test".
        strategy: "auto", "default", "one_device", "mirrored",
            "multi_worker" (reads TF_CONFIG) or "tpu".
        tpu: TPU name or address for TPUClusterResolver ("" = local/env).
        precision: "auto" (default), "float32", "mixed_bfloat16" or
            "mixed_float16" (dynamic loss scaling through
            keras.optimizers.LossScaleOptimizer). "auto" picks, for a new
            run, mixed_bfloat16 where the machine computes in bfloat16 (a
            TPU, a GPU of compute capability 8.0 or later, a CPU with AMX-BF16
            or AVX512-BF16), else float32, and says which and why after the
            plan; a resumed run keeps the precision it began with (config.json).
            KERAS_VIT_PRECISION pins what "auto" picks on a machine.
        accum_steps: split each replica's batch into this many micro-batches
            whose gradients are summed before one optimizer step.
        jit_compile: XLA-compile the per-replica gradient computation. None
            (the default) picks by measurement: XLA, except for
            mixed_bfloat16 on a machine without GPU or TPU, where oneDNN's
            bfloat16 matmuls without XLA ran the trainer's step faster than
            XLA's (figures, date and machine: docs/benchmarks.md); a step
            without XLA also takes the fused GELU (keras_vit.layers.fused).
            What ran is recorded in the plan (config.json's "plan": jit_compile).
        remat: rematerialise every encoder block (keras_vit.model.
            rematerialize_blocks): the backward pass recomputes each block's
            activations instead of holding them, for big models or batches
            that do not fit; same gradients, a lower peak memory for a
            longer step (figures: benchmarks/results_remat.md).
        seed: initialisation, shuffling and augmentation seed.
        deterministic: tf.config.experimental.enable_op_determinism().
        checkpoint_every: save every N steps (and on SIGTERM and at the end).
        keep_checkpoints: how many recent checkpoints to keep.
        eval_every: evaluate every N steps (0: only at the end).
        eval_batch_size: global evaluation batch (default: the micro-batch).
        log_every: progress/TensorBoard interval in steps.
        steps_per_loop: optimizer steps per call from the host into the
            device (a loop compiled into one tf.function): the host reads the
            step figures once per loop, so the device never waits for Python
            between steps. None: log_every. A loop also ends at every
            checkpoint, evaluation and the last step, and Ctrl-C/SIGTERM take
            effect at the end of the loop in flight. Does not change the
            results (the same steps run in the same order).
        shuffle_buffer: training shuffle buffer (examples).
        fewshot_shots: shots per class of the few-shot linear evaluation at
            the end, e.g. (1, 5, 10, 25); empty disables it.
        fewshot_l2: ridge regularisation of the few-shot least squares.
        fewshot_pool: the shots are drawn from the first N training examples.
        task: name of a Task in keras_vit.tasks.TASKS.
        progress: show the progress bar.
        strict_data: an image file that cannot be decoded stops the run
            (default: it is named in one warning and left out).
        drop_empty_classes: leave out class folders without images, with a
            warning (default: an error naming them).
        lora_rank: fine-tune with LoRA (ViTConfig.lora_rank): rank-r updates
            of the `lora_targets` projections and the head train, every other
            weight stays as `weights` gave it; model.keras holds the merged
            model and adapter.safetensors the updates and the head. Needs
            `weights`; 0 (default): every weight trains.
        lora_alpha: the updates' scale is lora_alpha / lora_rank (None: the rank).
        lora_targets: among "query", "key", "value", "out", "mlp"; default
            query and value (the LoRA paper's, peft's ViT guide's).
    """

    model: Union[str, ViTConfig, None] = None
    patch_size: Optional[int] = None
    position_embedding: Optional[str] = None
    classifier: Optional[str] = None
    dataset: str = "mnist5k"
    workdir: str = "runs/default"
    recipe: Union[Recipe, str] = FINETUNE
    weights: Optional[str] = None
    data_dir: Optional[str] = None
    num_classes: Optional[int] = None
    train_split: str = "train"
    eval_split: Optional[str] = None
    strategy: str = "auto"
    tpu: Optional[str] = None
    precision: str = "auto"
    accum_steps: int = 1
    jit_compile: Optional[bool] = None
    remat: bool = False
    seed: int = 0
    deterministic: bool = False
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    eval_every: int = 0
    eval_batch_size: Optional[int] = None
    log_every: int = 10
    steps_per_loop: Optional[int] = None
    shuffle_buffer: int = 10_000
    fewshot_shots: Tuple[int, ...] = ()
    fewshot_l2: float = 1.0
    fewshot_pool: int = 10_000
    task: str = "classification"
    # The per-pixel Tasks' (keras_vit.tasks.segmentation, depth): their head, whether the ViT trains,
    # and depth's loss.
    head: str = "linear"
    freeze_backbone: bool = False
    depth_loss: str = "silog"
    progress: bool = True
    # Data checks (keras_vit.training.data): undecodable files are left out
    # with a warning unless strict_data; empty class folders are an error
    # unless drop_empty_classes.
    strict_data: bool = False
    drop_empty_classes: bool = False
    lora_rank: int = 0
    lora_alpha: Optional[float] = None
    lora_targets: Tuple[str, ...] = DEFAULT_LORA_TARGETS

    def __post_init__(self):
        if isinstance(self.recipe, str):
            if self.recipe not in RECIPES:
                raise UserError(f"Unknown recipe {self.recipe!r}; known recipes: {sorted(RECIPES)}.")
            object.__setattr__(self, "recipe", RECIPES[self.recipe])
        elif isinstance(self.recipe, dict):
            object.__setattr__(self, "recipe", Recipe(**self.recipe))
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ViTConfig.from_dict(self.model))
        object.__setattr__(self, "fewshot_shots", tuple(int(s) for s in self.fewshot_shots))
        object.__setattr__(self, "lora_targets", lora_targets(self.lora_targets))
        if self.lora_alpha is not None:  # refused here, before the weights load (ViTConfig refuses it too)
            object.__setattr__(self, "lora_alpha", lora_alpha_value(self.lora_alpha))
        if self.position_embedding is not None:
            _check_choice("position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        if self.classifier is not None:
            _check_choice("classifier", self.classifier, CLASSIFIERS)
        _check_choice("strategy", self.strategy, STRATEGIES)
        _check_choice("precision", self.precision, PRECISIONS)
        if self.accum_steps < 1 or self.checkpoint_every < 1 or self.log_every < 1 or self.keep_checkpoints < 1:
            raise UserError("accum_steps, checkpoint_every, log_every and keep_checkpoints must be >= 1.")
        if self.steps_per_loop is not None and self.steps_per_loop < 1:
            raise UserError(f"steps_per_loop must be >= 1, got {self.steps_per_loop}.")

    @classmethod
    def create(cls, recipe: Union[str, Recipe] = "finetune", **overrides) -> "TrainConfig":
        """A config from a recipe plus overrides of any Recipe or TrainConfig field."""
        if isinstance(recipe, str) and recipe not in RECIPES:
            raise UserError(f"Unknown recipe {recipe!r}; known recipes: {sorted(RECIPES)}.")
        base = RECIPES[recipe] if isinstance(recipe, str) else recipe
        recipe_changes = _counted_in_one_unit({k: overrides.pop(k) for k in list(overrides) if k in RECIPE_FIELDS})
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise UserError(f"Unknown TrainConfig/Recipe field(s) {sorted(unknown)}.")
        return cls(recipe=dataclasses.replace(base, **recipe_changes), **overrides)

    def replace(self, **changes) -> "TrainConfig":
        """A copy with TrainConfig and/or Recipe fields changed."""
        recipe_changes = _counted_in_one_unit({k: changes.pop(k) for k in list(changes) if k in RECIPE_FIELDS})
        recipe = dataclasses.replace(self.recipe, **recipe_changes) if recipe_changes else self.recipe
        return dataclasses.replace(self, recipe=changes.pop("recipe", recipe), **changes)

    def to_dict(self) -> dict:
        """The settings as plain JSON-ready values (config.json)."""
        d = dataclasses.asdict(self)
        if isinstance(self.model, ViTConfig):
            d["model"] = self.model.to_dict()
        d["fewshot_shots"] = list(self.fewshot_shots)
        d["lora_targets"] = list(self.lora_targets)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config `to_dict` wrote (of this version or an earlier one: `upgraded`)."""
        return cls(**upgraded(d))


def upgraded(settings: dict) -> dict:
    """config.json's settings as this version writes them. In runs written before #38 a
    user's --classifier was written into the recipe: where the recipe's differs
    from its table's, it was the user's, and moves to TrainConfig.classifier. Fields
    added since (LoRA's, #39) are filled in at their defaults, which is what those runs
    were, so that a resumed run records no setting as changed that was not."""
    return _with_added_fields(_classifier_moved(settings)) if settings else settings


def _classifier_moved(settings: dict) -> dict:
    recipe = settings.get("recipe")
    if "classifier" in settings or not isinstance(recipe, dict) or recipe.get("name") not in RECIPES:
        return settings
    own = RECIPES[recipe["name"]].classifier
    if recipe.get("classifier", own) == own:
        return {**settings, "classifier": None}
    return {**settings, "classifier": recipe["classifier"], "recipe": {**recipe, "classifier": own}}


def _with_added_fields(settings: dict) -> dict:
    defaults = TrainConfig().to_dict()
    out = {**{k: v for k, v in defaults.items() if k not in settings}, **settings}
    if isinstance(out.get("model"), dict):
        out["model"] = ViTConfig.from_dict(out["model"]).to_dict()
    return out


def demo_config(workdir: str = "runs/demo", **overrides) -> TrainConfig:
    """The `make demo` run: the micro ViT "Mu/4" on 7x7 patches (4 blocks of
    width 128 over a 4x4 grid) from scratch with the "scratch" recipe on the
    5,000 MNIST digits shipped inside the package (keras_vit/data) (4,000 train / 1,000 test).

    Why these sizes: a step this small is bound by per-step overhead, not
    matmuls, so a wider model costs far less than its FLOPs, and 7x7
    patches (16 tokens) cost much less than 4x4 ones (49). Of the widths and
    patch sizes tried, width 128 on 7x7 patches was the cheapest to clear
    the accuracy the demo promises (docs/index.md, "The demo")."""
    settings = dict(model="Mu/4", patch_size=7, dataset="mnist5k", workdir=workdir, eval_every=1000,
                    log_every=25, checkpoint_every=500, fewshot_shots=(1, 5, 10, 25))
    settings.update(overrides)
    return TrainConfig.create("scratch", **settings)
