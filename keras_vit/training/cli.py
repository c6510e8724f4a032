"""`keras-vit train`: every TrainConfig and Recipe field is a flag.

    keras-vit train --model B/16 --weights imagenet21k --dataset tfds:cifar10 --recipe finetune \
        --image-size 384 --batch-size 512 --accum-steps 8 --steps 10000 --workdir runs/cifar10

Recipe flags left unset keep the recipe's value (see keras_vit.training.config).
Re-running the same command resumes from the workdir's latest checkpoint; Ctrl-C
(or SIGTERM) finishes the current step, checkpoints and exits (130 / 143), a
second Ctrl-C aborts at once. Re-running a finished run leaves its results alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from keras_vit.utils.flags import UsageError, image_size, non_negative_int, positive_int
from keras_vit.config import CLASSIFIERS, LORA_TARGETS, POSITION_EMBEDDINGS, lora_targets
from keras_vit.errors import UserError
from keras_vit.training import config as config_lib

_RECIPE_HELP = {
    "optimizer": "sgd | adam | adamw",
    "learning_rate": "peak learning rate",
    "momentum": "SGD momentum / Adam beta_1",
    "beta_2": "Adam beta_2",
    "weight_decay": "decoupled weight decay",
    "schedule": "cosine | linear | constant (after the linear warmup)",
    "warmup_steps": "linear warmup, in steps (replaces a recipe's warmup in epochs)",
    "warmup_epochs": "linear warmup, in passes over the training split (deit, finetune_ld: 5); turned into "
                     "steps with the split's size",
    "steps": "optimizer steps",
    "batch_size": "global batch per optimizer step (all replicas, all accumulation micro-steps)",
    "grad_clip_norm": "clip the all-reduced gradient to this global norm; 0 disables",
    "label_smoothing": "label smoothing of the cross-entropy",
    "train_augment": " | ".join(config_lib.AUGMENTATIONS) + " (affine: rotate up to 15 degrees, zoom 1 +- 0.15, "
                     "shift up to 1/8 of the side; translate: mirror-pad by 1/8, random crop back)",
    "image_size": "training and evaluation resolution, SIDE or HEIGHT,WIDTH (default: the recipe's, else the dataset's)",
    "representation_layer": "keep the pre-logits layer (true/false)",
    "dropout_rate": "ViT dropout",
    "stochastic_depth_rate": "drop-path rate of the last block",
    "epochs": "passes over the training split, instead of --steps",
    "lr_base_batch": "scale --learning-rate by batch / this (DeiT: 512)",
    "ema": "decay of a moving average of the weights (e.g. 0.9999): evaluation and model.keras use it; 0 off",
    "layer_decay": "learning-rate scale per block: rate ** (depth - block), embeddings lowest, head 1",
    "loss": "softmax | sigmoid (binary cross-entropy, head bias -log(classes))",
    "randaugment": "N,M: N ops of magnitude M (0..30) per image, e.g. 2,15",
    "mixup": "Mixup's Beta(alpha, alpha); 0 off (default: the recipe's, else its --aug-level's)",
    "cutmix": "CutMix's Beta(alpha, alpha); 0 off",
    "mix_prob": "probability that a pair of examples is mixed",
    "mix_switch_prob": "with --mixup and --cutmix: probability of CutMix",
    "random_erasing": "probability of erasing a random box of each image",
    "repeated_augmentation": "each example K times per epoch, differently augmented",
    "patch_dropout": "fraction of patch tokens dropped in training (evaluation keeps all)",
    "aug_level": "AugReg augmentation level: " + " | ".join(config_lib.AUG_LEVELS) + " | by_size "
                 "(sets --randaugment and --mixup; the augreg recipe picks by model size)",
}


def _bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _clip(text):
    value = float(text)
    return None if value == 0 else value


def _randaugment(text):
    try:
        ops, magnitude = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N,M (ops per image, magnitude 0..30) such as 2,15, "
                                         f"got {text!r}") from None
    return ops, magnitude


def _ema(text):
    value = float(text)
    return None if value == 0 else value


def _shots(text):
    try:
        shots = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shots per class such as 1,5,10,25, got {text!r}") from None
    if any(s < 1 for s in shots):
        raise argparse.ArgumentTypeError(f"shots must be positive, got {text!r}")
    return shots


def _lora_targets(text):
    targets = lora_targets(text)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown or not targets:
        raise argparse.ArgumentTypeError(f"{text!r}: choose among {','.join(LORA_TARGETS)}, e.g. query,value")
    return targets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--model", help="variant name, e.g. B/16, S/16, Mu/4 (keras-vit variants); optional when "
                                     "--weights is a .keras file or a workdir")
    run.add_argument("--patch-size", type=positive_int, help="replace the variant's patch size (training from scratch)")
    run.add_argument("--position-embedding", choices=POSITION_EMBEDDINGS,
                     help="replace the variant's position embedding (training from scratch; default: the "
                          "variant's, learned_1d, or the --weights' own)")
    run.add_argument("--classifier", choices=CLASSIFIERS,
                     help="replace the variant's classifier (default: the recipe's, else the variant's; "
                          "--weights fix their own)")
    run.add_argument("--weights", help="initial weights: checkpoint name (imagenet21k, ...), official .npz, "
                                       ".keras file or training workdir (encoder transferred, new head)")
    run.add_argument("--dataset",
                     help="mnist5k (bundled) | tfds:NAME or tfds:DATA_DIR/NAME/VERSION | folder:PATH | "
                          "list:TRAIN.csv[,EVAL.csv] (path,label rows; or .json) | tfrecord:DIR (default: %(default)s)")
    run.add_argument("--data-dir", help="tfds data directory")
    run.add_argument("--num-classes", type=positive_int, help="class count for tfrecord: without labels.txt")
    run.add_argument("--train-split", help="tfds training split (default: %(default)s)")
    run.add_argument("--eval-split", help="tfds evaluation split (default: validation, else test)")
    run.add_argument("--workdir", required=True, help="checkpoints, TensorBoard logs, model.keras, results.json")
    run.add_argument("--recipe", choices=sorted(config_lib.RECIPES), help="named defaults (default: %(default)s)")
    run.add_argument("--strategy", choices=config_lib.STRATEGIES,
                     help="tf.distribute strategy (multi_worker reads TF_CONFIG; default: %(default)s)")
    run.add_argument("--tpu", help="TPU name/address for TPUClusterResolver ('' = local TPU VM)")
    run.add_argument("--precision", choices=config_lib.PRECISIONS, help="(default: %(default)s)")
    run.add_argument("--accum-steps", type=positive_int, help="gradient accumulation micro-steps (default: %(default)s)")
    jit = run.add_mutually_exclusive_group()
    jit.add_argument("--jit", dest="jit_compile", action="store_true",
                     help="XLA-compile the step (default: XLA, except mixed_bfloat16 on a CPU, where oneDNN is faster)")
    jit.add_argument("--no-jit", dest="jit_compile", action="store_false", help="do not XLA-compile the step")
    run.add_argument("--remat", action="store_true",
                     help="recompute each encoder block's activations in the backward pass: less memory "
                          "(L/16 at batch 8: 39%% less) for more time per step (1.2-1.3x)")
    run.add_argument("--seed", type=int, help="(default: %(default)s)")
    run.add_argument("--deterministic", action="store_true", help="tf.config.experimental.enable_op_determinism()")
    run.add_argument("--checkpoint-every", type=positive_int, help="steps between checkpoints (default: %(default)s)")
    run.add_argument("--keep-checkpoints", type=positive_int, help="(default: %(default)s)")
    run.add_argument("--eval-every", type=non_negative_int,
                     help="steps between evaluations (0: at the end only; default: %(default)s)")
    run.add_argument("--eval-batch-size", type=positive_int)
    run.add_argument("--log-every", type=positive_int,
                     help="steps between progress/TensorBoard updates (default: %(default)s)")
    run.add_argument("--steps-per-loop", type=positive_int,
                     help="optimizer steps per call into the device; figures are read once per loop "
                          "(default: --log-every). A loop boundary is also every checkpoint, evaluation and "
                          "the last step; Ctrl-C or SIGTERM finishes the loop in flight, writes a checkpoint "
                          "and stops")
    run.add_argument("--shuffle-buffer", type=positive_int,
                     help="examples held for shuffling record streams (TFRecord, tfds without random "
                          "access); folders, lists and arrays are shuffled whole every epoch whatever its size "
                          "(default: %(default)s)")
    run.add_argument("--fewshot-shots", type=_shots,
                     help="few-shot linear evaluation at the end, e.g. 1,5,10,25")
    run.add_argument("--fewshot-l2", type=float, help="(default: %(default)s)")
    run.add_argument("--fewshot-pool", type=positive_int, help="(default: %(default)s)")
    run.add_argument("--task",
                     help="what is learned: classification | segmentation | depth | masked_patch | image_text "
                          "(keras_vit.tasks.TASKS; default: %(default)s, or the recipe's task: --recipe "
                          "masked_patch picks masked_patch, siglip and clip image_text)")
    dense = parser.add_argument_group("segmentation and depth (--task segmentation | depth)")
    dense.add_argument("--head", choices=("linear", "dpt"),
                       help="linear: one linear map of the last block's patch tokens, upsampled (DINOv2's and "
                            "DINOv3's probe); dpt: DPT's decoder on four blocks (default: %(default)s)")
    dense.add_argument("--freeze-backbone", action="store_true",
                       help="train the head alone (with --head linear: the linear probe)")
    dense.add_argument("--depth-loss", choices=("silog", "l1"),
                       help="silog: the scale-invariant log loss; l1: metres (default: %(default)s)")
    run.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bars (for logs and CI); what runs and the evaluations are still printed")
    lora = parser.add_argument_group("LoRA: train low-rank updates and the head, the rest as --weights gave it")
    lora.add_argument("--lora-rank", type=non_negative_int,
                      help="rank of the updates (4-16 is usual; 0: every weight trains; default: %(default)s); "
                           "model.keras is the merged model, adapter.safetensors the updates and the head")
    lora.add_argument("--lora-alpha", type=float, help="the updates' scale is alpha / rank (default: the rank)")
    lora.add_argument("--lora-targets", type=_lora_targets,
                      help=f"projections to adapt, among {','.join(LORA_TARGETS)} (mlp: both MLP layers; "
                           f"default: query,value, as the LoRA paper and peft's ViT guide)")
    data = parser.add_argument_group("data checks")
    data.add_argument("--strict-data", action="store_true",
                      help="stop on an image file that cannot be decoded (default: name it in a warning, leave it out)")
    data.add_argument("--drop-empty-classes", action="store_true",
                      help="leave out class folders without images, with a warning (default: an error)")

    recipe = parser.add_argument_group("recipe overrides (default: the recipe's value)")
    types = {"grad_clip_norm": _clip, "representation_layer": _bool, "image_size": image_size,
             "batch_size": positive_int, "steps": non_negative_int, "warmup_steps": non_negative_int,
             "epochs": float, "warmup_epochs": float, "mixup": float, "lr_base_batch": positive_int, "ema": _ema,
             "layer_decay": float,
             "randaugment": _randaugment, "repeated_augmentation": positive_int, "aug_level": str}
    for field in config_lib.RECIPE_FIELDS:
        default_type = type(getattr(config_lib.FINETUNE, field))
        kind = types.get(field, default_type)
        recipe.add_argument("--" + field.replace("_", "-"), type=kind, default=argparse.SUPPRESS,
                            help=_RECIPE_HELP[field])
    # Every run flag's default is its TrainConfig field's (written once, in the dataclass); a recipe
    # flag left out keeps the recipe's value (SUPPRESS above).
    parser.set_defaults(**field_defaults())


def field_defaults() -> dict:
    """{TrainConfig field: its default}, the recipe by name: what an unset flag means."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_lib.TrainConfig)
                if f.default is not dataclasses.MISSING}
    defaults["recipe"] = defaults["recipe"].name
    return defaults


def config_from_args(args) -> config_lib.TrainConfig:
    values = dict(vars(args))
    values.pop("command", None)
    recipe = values.pop("recipe")
    return config_lib.TrainConfig.create(recipe, **values)


def check_args(args) -> config_lib.TrainConfig:
    """The config, after the checks that need neither TensorFlow nor data: a
    bad value or name is a UsageError naming the flag and the fix."""
    from keras_vit.utils import storage
    from keras_vit.weights import sources
    from keras_vit.variants import get_variant

    from keras_vit.training.plan import check_batch

    try:
        config = config_from_args(args)
        check_batch(config.recipe.batch_size, 1, config.accum_steps)
    except UserError as error:
        raise UsageError(str(error)) from None
    if args.model is not None:
        try:
            get_variant(args.model)
        except UserError as error:
            raise UsageError(f"--model: {error}") from None
        _check_official_weights(args.model, args.weights)
    try:  # resolve_weights checks it too (train() from Python): here it is found before TensorFlow starts
        sources.check_weights_exist(args.weights)
    except UserError as error:
        raise UsageError(str(error)) from None
    if storage.isfile(args.workdir):
        raise UsageError(f"--workdir {args.workdir!r} is a file; give a folder (it is created if missing).")
    return config


def _check_official_weights(model, weights):
    """An official checkpoint name that is not published for the model fails
    here, in a moment, not after the data has been read."""
    from keras_vit.weights import hub

    if weights is None or weights not in hub.CHECKPOINTS:
        return
    try:
        hub.checkpoint_url(model, weights)
    except UserError as error:
        raise UsageError(f"--weights: {error}") from None


def run(args) -> int:
    config = check_args(args)
    from keras_vit.training import TrainingInterrupted, train

    try:
        results = train(config)
    except TrainingInterrupted as error:
        print(f"keras-vit train: {error}", file=sys.stderr)
        return error.exit_code
    evaluated = results["eval"]
    if "accuracy" in evaluated:  # a classifier's top-k
        figures = {"eval_top1": evaluated["accuracy"], **({"eval_top5": evaluated["top5"]} if "top5" in evaluated
                                                          else {}), "eval_loss": evaluated["loss"]}
    else:  # another Task's own figures (Task.summarize)
        figures = {"eval": {k: v for k, v in evaluated.items() if k != "num_examples"}}
    summary = {
        **figures, "steps": results["steps"],
        "images_per_sec": results["images_per_sec"], "wall_time_s": results["wall_time_s"],
    }
    if "fewshot" in results:
        summary["fewshot"] = results["fewshot"]
    if "fewshot_random_init" in results:
        summary["fewshot_random_init"] = results["fewshot_random_init"]
    print(json.dumps(summary, indent=2))
    if "model_path" in results and not results.get("already_finished"):
        print(f"wrote {results['model_path']} and {config.workdir}/results.json")
        # The logs need the tensorboard package only to be viewed.
        print(f"curves: tensorboard --logdir {config.workdir}/tensorboard   (pip install tensorboard)")
    return 0
