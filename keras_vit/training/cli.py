"""`keras-vit train`: every TrainConfig and Recipe field is a flag.

    keras-vit train --model B/16 --weights imagenet21k --dataset tfds:cifar10 --recipe finetune \
        --image-size 384 --batch-size 512 --accum-steps 8 --steps 10000 --workdir runs/cifar10

Recipe flags left unset keep the recipe's value (see keras_vit.training.config).
Re-running the same command resumes from the workdir's latest checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys

from keras_vit.training import config as config_lib

_RECIPE_HELP = {
    "optimizer": "sgd | adam | adamw",
    "learning_rate": "peak learning rate",
    "momentum": "SGD momentum / Adam beta_1",
    "beta_2": "Adam beta_2",
    "weight_decay": "decoupled weight decay",
    "schedule": "cosine | linear | constant (after the linear warmup)",
    "warmup_steps": "linear warmup steps",
    "steps": "optimizer steps",
    "batch_size": "global batch per optimizer step (all replicas, all accumulation micro-steps)",
    "grad_clip_norm": "clip the all-reduced gradient to this global norm; 0 disables",
    "label_smoothing": "label smoothing of the cross-entropy",
    "train_augment": "inception_crop_flip | inception_crop | flip | translate | none",
    "image_size": "training and evaluation resolution (default: the recipe's, else the dataset's)",
    "representation_layer": "keep the pre-logits layer (true/false)",
    "classifier": "token | gap (default: the recipe's, else the variant's)",
    "dropout_rate": "ViT dropout",
    "stochastic_depth_rate": "drop-path rate of the last block",
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


def _shots(text):
    return tuple(int(s) for s in text.split(",") if s.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--model", help="variant name, e.g. B/16, S/16, Mu/4 (keras-vit variants); optional when "
                                     "--weights is a .keras file or a workdir")
    run.add_argument("--patch-size", type=int, help="replace the variant's patch size (training from scratch)")
    run.add_argument("--weights", help="initial weights: checkpoint name (imagenet21k, ...), official .npz, "
                                       ".keras file or training workdir (encoder transferred, new head)")
    run.add_argument("--dataset", default="mnist5k",
                     help="mnist5k (bundled) | tfds:NAME or tfds:DATA_DIR/NAME/VERSION | folder:PATH | "
                          "list:TRAIN.csv[,EVAL.csv] (path,label rows; or .json) | tfrecord:DIR (default: mnist5k)")
    run.add_argument("--data-dir", help="tfds data directory")
    run.add_argument("--num-classes", type=int, help="class count for tfrecord: without labels.txt")
    run.add_argument("--train-split", default="train", help="tfds training split (default: train)")
    run.add_argument("--eval-split", help="tfds evaluation split (default: validation, else test)")
    run.add_argument("--workdir", required=True, help="checkpoints, TensorBoard logs, model.keras, results.json")
    run.add_argument("--recipe", default="finetune", choices=sorted(config_lib.RECIPES),
                     help="named defaults (default: finetune)")
    run.add_argument("--strategy", default="auto", choices=config_lib.STRATEGIES,
                     help="tf.distribute strategy (multi_worker reads TF_CONFIG)")
    run.add_argument("--tpu", help="TPU name/address for TPUClusterResolver ('' = local TPU VM)")
    run.add_argument("--precision", default="float32", choices=config_lib.PRECISIONS)
    run.add_argument("--accum-steps", type=int, default=1, help="gradient accumulation micro-steps")
    run.add_argument("--no-jit", dest="jit_compile", action="store_false", help="do not XLA-compile the step")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--deterministic", action="store_true", help="tf.config.experimental.enable_op_determinism()")
    run.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints")
    run.add_argument("--keep-checkpoints", type=int, default=2)
    run.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: at the end only)")
    run.add_argument("--eval-batch-size", type=int)
    run.add_argument("--log-every", type=int, default=10, help="steps between progress/TensorBoard updates")
    run.add_argument("--shuffle-buffer", type=int, default=10_000)
    run.add_argument("--fewshot-shots", type=_shots, default=(),
                     help="few-shot linear evaluation at the end, e.g. 1,5,10,25")
    run.add_argument("--fewshot-l2", type=float, default=1.0)
    run.add_argument("--fewshot-pool", type=int, default=10_000)
    run.add_argument("--task", default="classification",
                     help="what is learned: classification | masked_patch (keras_vit.training.tasks.TASKS; "
                          "default: classification, or the recipe's task: --recipe masked_patch picks masked_patch)")
    run.add_argument("--no-progress", dest="progress", action="store_false")
    data = parser.add_argument_group("data checks")
    data.add_argument("--strict-data", action="store_true",
                      help="stop on an image file that cannot be decoded (default: name it in a warning, leave it out)")
    data.add_argument("--drop-empty-classes", action="store_true",
                      help="leave out class folders without images, with a warning (default: an error)")

    recipe = parser.add_argument_group("recipe overrides (default: the recipe's value)")
    types = {"grad_clip_norm": _clip, "representation_layer": _bool}
    for field in config_lib.RECIPE_FIELDS:
        default_type = type(getattr(config_lib.FINETUNE, field))
        kind = types.get(field, str if field == "classifier" else (int if field == "image_size" else default_type))
        recipe.add_argument("--" + field.replace("_", "-"), type=kind, default=argparse.SUPPRESS,
                            help=_RECIPE_HELP[field])


def config_from_args(args) -> config_lib.TrainConfig:
    values = dict(vars(args))
    values.pop("command", None)
    recipe = values.pop("recipe")
    return config_lib.TrainConfig.create(recipe, **values)


def run(args) -> int:
    from keras_vit.training import IncompatibleCheckpointError, NonFiniteLossError, TrainingInterrupted, train

    config = config_from_args(args)
    try:
        results = train(config)
    except (IncompatibleCheckpointError, NonFiniteLossError) as error:
        print(f"keras-vit train: error: {error}", file=sys.stderr)
        return 1
    except TrainingInterrupted as error:
        print(f"keras-vit train: {error}", file=sys.stderr)
        return 143
    summary = {
        "eval_top1": results["eval"]["accuracy"], "eval_top5": results["eval"]["top5"],
        "eval_loss": results["eval"]["loss"], "steps": results["steps"],
        "images_per_sec": results["images_per_sec"], "wall_time_s": results["wall_time_s"],
    }
    if "fewshot" in results:
        summary["fewshot"] = results["fewshot"]
    if "fewshot_random_init" in results:
        summary["fewshot_random_init"] = results["fewshot_random_init"]
    print(json.dumps(summary, indent=2))
    if "model_path" in results:
        print(f"wrote {results['model_path']} and {config.workdir}/results.json")
    return 0
