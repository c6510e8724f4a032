"""Recipes, config overrides and the `keras-vit train` flags."""

import argparse
import dataclasses

import pytest

from keras_vit.training import FINETUNE, PRETRAIN, RECIPES, SCRATCH, TrainConfig, demo_config
from keras_vit.training import cli


def test_the_papers_recipes():
    assert (FINETUNE.optimizer, FINETUNE.momentum, FINETUNE.weight_decay) == ("sgd", 0.9, 0.0)
    assert (FINETUNE.schedule, FINETUNE.batch_size, FINETUNE.grad_clip_norm) == ("cosine", 512, 1.0)
    assert FINETUNE.warmup_steps > 0 and FINETUNE.train_augment == "inception_crop_flip"
    assert FINETUNE.representation_layer is False and FINETUNE.image_size == 384
    assert (PRETRAIN.optimizer, PRETRAIN.momentum, PRETRAIN.beta_2) == ("adamw", 0.9, 0.999)
    assert (PRETRAIN.weight_decay, PRETRAIN.batch_size) == (0.1, 4096)
    assert (PRETRAIN.warmup_steps, PRETRAIN.schedule, PRETRAIN.representation_layer) == (10_000, "linear", True)
    assert set(RECIPES) == {"finetune", "pretrain", "scratch", "masked_patch", "augreg", "deit", "plain_baseline",
                            "finetune_ld", "siglip", "clip"} and SCRATCH.name == "scratch"


def _resolved(config):
    """The recipe as the run's plan resolves it (the augmentation level read)."""
    from keras_vit.training.plan import with_aug_level
    from keras_vit.variants import get_variant

    return with_aug_level(config.recipe, get_variant(config.model))


def test_the_recipes_without_jft_and_their_augmentation_levels():
    # AugReg: big_vision's level per size; an explicit level or flag wins.
    assert _resolved(TrainConfig.create("augreg", model="Ti/16")).randaugment == (2, 0)
    medium2 = _resolved(TrainConfig.create("augreg", model="B/16"))
    assert (medium2.aug_level, medium2.randaugment, medium2.mixup) == ("medium2", (2, 15), 0.5)
    assert _resolved(TrainConfig.create("augreg", model="S/32")).aug_level == "light2"
    # Any spelling the variant table takes, and a ViTConfig, get the same level as the name.
    from keras_vit.training.plan import aug_level_by_size
    from keras_vit.variants import get_variant
    for name, level in (("Ti/16", "light1"), ("S/32", "light2"), ("S/16", "medium2"), ("B/16", "medium2")):
        spellings = (name, name.lower(), f"ViT-{name}", get_variant(name))
        assert [aug_level_by_size(model) for model in spellings] == [level] * 4, name
    override = _resolved(TrainConfig.create("augreg", model="B/16", aug_level="light1", mixup=0.1))
    assert (override.randaugment, override.mixup) == ((2, 0), 0.1)
    off = _resolved(TrainConfig.create("augreg", model="B/16", randaugment=(0, 0), mixup=0.0))
    assert (off.randaugment, off.mixup, off.mixes) == ((0, 0), 0.0, False)
    deit = RECIPES["deit"]
    assert (deit.randaugment, deit.mixup, deit.cutmix, deit.random_erasing) == ((2, 9), 0.8, 1.0, 0.25)
    assert (deit.repeated_augmentation, deit.ema, deit.epochs, deit.peak_learning_rate) == (3, 0.99996, 300, 1e-3)
    assert (RECIPES["plain_baseline"].classifier, RECIPES["plain_baseline"].epochs) == ("gap", 90)
    assert RECIPES["finetune_ld"].layer_decay == 0.65 and RECIPES["finetune_ld"].ema
    with pytest.raises(ValueError, match="aug_level"):
        TrainConfig.create("augreg", aug_level="huge")
    with pytest.raises(ValueError, match="aug_level"):
        TrainConfig(recipe=dataclasses.replace(RECIPES["augreg"], aug_level="huge"))
    # Counted in epochs; --steps replaces them, in create() and replace() alike.
    assert TrainConfig.create("deit", steps=1000).recipe.epochs is None
    assert TrainConfig(recipe="deit").replace(steps=1000).recipe.epochs is None
    assert TrainConfig(recipe="deit").replace(warmup_steps=7).recipe.warmup_epochs is None
    # Warmups as the papers state them: DeiT and BEiT/MAE 5 epochs; big_vision 10k steps of its batch.
    assert (RECIPES["deit"].warmup_epochs, RECIPES["finetune_ld"].warmup_epochs) == (5, 5)
    assert round(RECIPES["augreg"].warmup_epochs * 1_281_167 / 4096) == 10_000
    assert round(RECIPES["plain_baseline"].warmup_epochs * 1_281_167 / 1024) == 10_000


def test_every_way_of_building_a_config_trains_the_same_run():
    """create(), the constructor and replace() give one plan: the level by
    size is read where the run is resolved, not in create() alone."""
    from keras_vit.training import data as data_lib
    from keras_vit.training import plan as plan_lib

    made = [
        TrainConfig.create("augreg", model="B/16", dataset="mnist5k", image_size=32),
        TrainConfig(model="B/16", dataset="mnist5k", recipe=dataclasses.replace(RECIPES["augreg"], image_size=32)),
        TrainConfig(model="B/16", dataset="mnist5k", recipe="finetune").replace(recipe=RECIPES["augreg"])
        .replace(image_size=32),
        TrainConfig.from_dict(TrainConfig.create("augreg", model="B/16", image_size=32).to_dict()),
    ]
    source = data_lib.open_source(made[0])
    plans = [plan_lib.resolve(config, source) for config in made]
    ops = [plan.to_dict()["augmentation"] for plan in plans]
    assert ops[0] == ops[1] == ops[2] == ops[3]
    assert {"op": "randaugment", "num_ops": 2, "magnitude": 15} in ops[0]
    assert ops[0][-1]["op"] == "mix" and ops[0][-1]["mixup"] == 0.5
    assert {plan.recipe.aug_level for plan in plans} == {"medium2"}
    assert len({(plan.steps, plan.warmup_steps) for plan in plans}) == 1


def test_regulariser_flags_parse_and_bad_values_are_usage_errors():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--workdir", "w", "--recipe", "scratch", "--randaugment", "2,15", "--mixup", "0.8",
                              "--cutmix", "1", "--mix-prob", "0.5", "--random-erasing", "0.25",
                              "--repeated-augmentation", "3", "--ema", "0.999", "--layer-decay", "0.75",
                              "--loss", "sigmoid", "--epochs", "2.5", "--lr-base-batch", "512",
                              "--patch-dropout", "0.5", "--aug-level", "light2"])
    recipe = cli.config_from_args(args).recipe
    assert (recipe.randaugment, recipe.mixup, recipe.cutmix, recipe.mix_prob) == ((2, 15), 0.8, 1.0, 0.5)
    assert (recipe.repeated_augmentation, recipe.ema, recipe.layer_decay, recipe.loss) == (3, 0.999, 0.75, "sigmoid")
    assert (recipe.epochs, recipe.lr_base_batch, recipe.patch_dropout, recipe.aug_level) == (2.5, 512, 0.5, "light2")
    deit = cli.config_from_args(parser.parse_args(["--workdir", "w", "--recipe", "deit", "--ema", "0",
                                                   "--warmup-epochs", "0.5"])).recipe
    assert (deit.ema, deit.warmup_epochs, deit.epochs) == (None, 0.5, 300)
    for bad in (["--randaugment", "2"], ["--ema", "1.5"], ["--loss", "hinge"], ["--mix-prob", "2"],
                ["--patch-dropout", "1"], ["--randaugment", "2,40"]):
        try:
            cli.check_args(parser.parse_args(["--workdir", "w", *bad]))
        except (cli.UsageError, SystemExit):
            continue
        raise AssertionError(f"{bad} was accepted")


def test_overrides_reach_the_recipe_and_the_run(monkeypatch):
    config = TrainConfig.create("finetune", model="B/16", learning_rate=0.01, accum_steps=8, workdir="w")
    assert config.recipe.learning_rate == 0.01 and config.recipe.optimizer == "sgd"
    assert config.accum_steps == 8 and config.recipe.batch_size == 512
    assert TrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="Unknown"):
        TrainConfig.create("finetune", learning_rat=0.1)
    # The plan's one rule, checked by the command line before TensorFlow starts.
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    from keras_vit.utils import console as _console

    monkeypatch.setattr(_console, "COMMAND_LINE", True)  # as keras_vit.cli.main sets it
    with pytest.raises(cli.UsageError, match=r"--batch-size 100 must be a multiple of .* use --batch-size 96"):
        cli.check_args(parser.parse_args(["--workdir", "w", "--batch-size", "100", "--accum-steps", "8"]))
    with pytest.raises(ValueError, match="recipe"):
        TrainConfig.create("nonsense")


def test_flags_parse_into_the_same_config():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([
        "--model", "B/16", "--weights", "imagenet21k", "--dataset", "tfds:cifar10", "--recipe", "finetune",
        "--image-size", "384", "--batch-size", "512", "--accum-steps", "8", "--steps", "10000",
        "--workdir", "runs/cifar10", "--grad-clip-norm", "0", "--fewshot-shots", "1,5,10,25",
        "--precision", "mixed_bfloat16", "--strategy", "mirrored", "--representation-layer", "false",
    ])
    config = cli.config_from_args(args)
    assert config == TrainConfig.create(
        "finetune", model="B/16", weights="imagenet21k", dataset="tfds:cifar10", image_size=384,
        batch_size=512, accum_steps=8, steps=10_000, workdir="runs/cifar10", grad_clip_norm=None,
        fewshot_shots=(1, 5, 10, 25), precision="mixed_bfloat16", strategy="mirrored",
        representation_layer=False)


def test_demo_config_is_the_scratch_recipe_on_the_digits():
    config = demo_config("runs/x")
    assert config.recipe.name == "scratch" and config.dataset == "mnist5k" and config.model == "Mu/4"
    assert config.patch_size == 7


@pytest.mark.parametrize("flags,given", [([], None), (["--jit"], True), (["--no-jit"], False)])
def test_jit_flags(flags, given):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", "Mu/4", "--workdir", "w", *flags])
    assert cli.config_from_args(args).jit_compile is given


def test_remat_flag():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    parse = lambda *flags: cli.config_from_args(parser.parse_args(["--model", "Mu/4", "--workdir", "w", *flags]))  # noqa: E731
    assert parse().remat is False and parse("--remat").remat is True


@pytest.mark.parametrize("precision,given,expected", [
    ("float32", None, True),             # XLA is the faster float32 path
    ("mixed_bfloat16", None, False),     # on a CPU, oneDNN without XLA is (benchmarks/results_training.md)
    ("mixed_bfloat16", True, True),      # what the user asks for wins
    ("float32", False, False),
])
def test_the_default_step_compiler_is_the_measured_faster_one(precision, given, expected):
    import tensorflow as tf

    from keras_vit.training.steps import resolve_jit_compile

    assert not tf.config.list_logical_devices("GPU")  # this suite runs on CPUs (CI has no GPU)
    config = TrainConfig.create("scratch", model="Mu/4", workdir="w", precision=precision, jit_compile=given)
    assert resolve_jit_compile(config, tf.distribute.get_strategy()) is expected


def test_an_unset_flag_is_its_fields_default_and_every_field_has_a_flag():
    """#38 item 8: the defaults live in TrainConfig alone (the command line used to retype 16 of them)."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.config_from_args(parser.parse_args(["--workdir", "w"])) == TrainConfig(workdir="w")
    help_text = " ".join(parser.format_help().split())
    spelled = {"jit_compile": "--no-jit", "progress": "--no-progress"}
    for field in dataclasses.fields(TrainConfig):
        assert spelled.get(field.name, "--" + field.name.replace("_", "-")) in help_text, field.name
    assert "(default: 1000)" in help_text and "(default: finetune)" in help_text  # --checkpoint-every, --recipe
