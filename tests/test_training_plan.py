"""The run's plan (#29): batches, steps and warmups resolved once, its checks
one line each, and what it resolved written into the run folder."""

import json

import numpy as np
import pytest

from keras_vit.errors import UserError
from keras_vit.training import RECIPES, TrainConfig, train
from keras_vit.training import data as data_lib
from keras_vit.training import plan as plan_lib
from tests.training_helpers import TINY, tiny_config


def _plan(recipe="deit", num_replicas=1, **overrides):
    settings = {"model": "Mu/4", "dataset": "mnist5k", "image_size": 28, "patch_size": 7, **overrides}
    config = TrainConfig.create(recipe, **settings)
    source = data_lib.open_source(config)
    return plan_lib.resolve(config, source, num_replicas=num_replicas)


def _warmup_warnings(plan):
    return [w for w in plan.warnings if "warmup" in w]


def test_warmups_in_epochs_become_steps_of_the_users_data():
    """DeiT: 5 epochs of the 4,000 digits at batch 100 = 200 steps of a 300-epoch run (12,000)."""
    plan = _plan(batch_size=100)
    assert (plan.steps, plan.warmup_steps, plan.train_size) == (12_000, 200, 4000)
    assert plan.recipe.peak_learning_rate == pytest.approx(5e-4 * 100 / 512)
    # --epochs 10: the warmup stays 5 epochs, half the run: no warning at exactly half.
    short = _plan(batch_size=100, epochs=10)
    assert (short.steps, short.warmup_steps) == (400, 200) and not _warmup_warnings(short)
    # AugReg's 10k steps of 4,096 at ImageNet size: about 32 epochs, in steps of this batch.
    augreg = _plan("augreg", batch_size=100)
    assert augreg.warmup_steps == round(10_000 * 4096 / 1_281_167 * 4000 / 100)


def test_a_warmup_longer_than_half_the_run_is_named_with_the_fix():
    plan = _plan(batch_size=100, steps=20)  # --steps on an epoch-counted recipe: the warmup is still 5 epochs
    assert plan.warmup_steps == 200
    (warning,) = _warmup_warnings(plan)
    assert "warmup (200 steps) takes more than half of the run (20 steps)" in warning and "warmup_steps=" in warning
    assert not _warmup_warnings(_plan(batch_size=100, steps=20, warmup_steps=2))
    # DeiT's weight average (0.99996, about 25,000 steps) is longer than this run too.
    (ema,) = [w for w in plan.warnings if "weight average" in w]
    assert "spans about 25,000 steps, more than the run (20 steps)" in ema and "ema=0" in ema
    assert _plan(batch_size=100, steps=20, warmup_steps=2, ema=0.5).warnings == ()


@pytest.mark.slow
def test_an_epoch_counted_recipe_reaches_its_peak_in_a_short_run(tmp_path):
    """--recipe deit --steps 20 on a small dataset: the learning rate climbs to
    its peak and decays (it stayed near 0 when the warmup was 6,255 steps)."""
    lrs = []
    config = tiny_config(tmp_path, recipe="deit", steps=20, batch_size=50, image_size=28, train_augment="flip")
    config = config.replace(warmup_epochs=0.1)  # 0.1 x 4,000 / 50 = 8 steps
    train(config, callbacks=[lambda step, logs: lrs.append(logs["lr"])])
    peak = 1e-3 * 50 / 512  # tiny_config: --learning-rate 1e-3, scaled by batch / 512 (DeiT)
    assert max(lrs) == pytest.approx(peak, rel=0.05) and 6 <= np.argmax(lrs) <= 8
    assert lrs[-1] < 0.05 * peak
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["plan"]["warmup_steps"] == 8 and written["recipe"]["warmup_epochs"] == 0.1


def test_any_batch_works_on_any_replica_count_and_bad_splits_name_the_fix():
    for replicas in (1, 2, 8):
        plan = _plan(batch_size=1024, num_replicas=replicas)
        assert (plan.per_replica_batch, plan.micro_batch) == (1024 // replicas, 1024 // replicas)
    with pytest.raises(UserError, match=r"batch_size=100 must be a multiple of .* use batch_size=96"):
        _plan(batch_size=100, num_replicas=8)
    with pytest.raises(UserError, match=r"accum_steps=3"):
        _plan(batch_size=100, num_replicas=2, accum_steps=3)


def test_the_checks_of_image_size_and_unknown_sizes_are_one_line_each():
    with pytest.raises(UserError, match=r"image_size=\(30, 30\) is not a multiple of the model's patch \(7 px\): "
                                        r"use image_size=\(28, 28\)"):
        _plan(image_size=30)
    with pytest.raises(UserError, match=r"^the finetune recipe's default image size, 384x384, is not a multiple .*"
                                        r"use image_size=\(378, 378\)"):  # not a quoted image_size never given (#37)
        _plan("finetune", image_size=384)

    class Unknown:
        name, train_split, sizes, num_channels, num_classes, image_size = "tfrecord:x", "train", {"train": None}, 3, 2, None
        fields = ("image", "label")

    config = TrainConfig.create("deit", model=TINY, image_size=28)
    with pytest.raises(UserError, match="cannot be turned into steps: give steps=N"):
        plan_lib.resolve(config, Unknown())
    with pytest.raises(UserError, match="warmup of 5 epochs cannot be turned into steps: give warmup_steps=N"):
        plan_lib.resolve(config.replace(steps=10), Unknown())


def test_the_plan_orders_every_recipes_augmentation():
    expected = {
        "finetune": ["inception_crop", "flip", "to_model_range"],
        "scratch": ["resize", "affine", "to_model_range"],
        "deit": ["inception_crop", "flip", "randaugment", "to_model_range", "random_erasing"],
        "plain_baseline": ["inception_crop", "flip", "randaugment", "to_model_range"],
    }
    for name, ops in expected.items():
        plan = _plan(name)
        assert [op["op"] for op in plan.augmentation] == ops, name
    assert _plan("deit").mixing == {"mixup": 0.8, "cutmix": 1.0, "prob": 1.0, "switch_prob": 0.5,
                                    "partner_offset": 3}
    assert _plan("finetune").mixing is None
    # Mu/4 is width 128: AugReg's light1 (RandAugment(2, 0), no Mixup).
    augreg = _plan("augreg")
    assert augreg.recipe.aug_level == "light1" and augreg.mixing is None
    assert {"op": "randaugment", "num_ops": 2, "magnitude": 0} in augreg.augmentation
    json.dumps(augreg.to_dict())  # config.json takes it as it is
    assert set(RECIPES) >= set(expected)


def test_messages_name_flags_on_the_command_line_and_keywords_in_python(monkeypatch):
    """#30: the same refusal in the caller's language."""
    from keras_vit.utils import console as _console
    from keras_vit.training import memory

    with pytest.raises(UserError, match=r"batch_size=100 .* use batch_size=96\.$"):
        _plan(batch_size=100, num_replicas=8)
    assert "accum_steps=4" in memory.ways_out(32) and "remat=True" in memory.ways_out(32)
    assert "--" not in memory.ways_out(32)
    with pytest.raises(UserError, match=r"^the finetune recipe's default image size, 384x384, .* use "
                                        r"image_size=\(378, 378\)\.$"):
        _plan("finetune", image_size=384)
    monkeypatch.setattr(_console, "COMMAND_LINE", True)
    with pytest.raises(UserError, match=r"--batch-size 100 .* use --batch-size 96\.$"):
        _plan(batch_size=100, num_replicas=8)
    with pytest.raises(UserError, match=r"--image-size 30,30 is not a multiple .* use --image-size 28,28"):
        _plan(image_size=30)
    with pytest.raises(UserError, match=r"^the finetune recipe's default image size, 384x384, is not a multiple .*"
                                        r"use --image-size 378,378\.$"):  # not an --image-size never given (#37)
        _plan("finetune", image_size=384)
    assert "--accum-steps 4" in memory.ways_out(32) and "--remat" in memory.ways_out(32)


def test_the_plan_scales_pixels_as_the_models_weights_expect():
    """The op "to_model_range" scales to the model's pixel_normalization
    (DeiT/DINOv2: ImageNet's mean and std); a [-1, 1] model's plan reads as
    it always has (config.json, describe), and training, evaluation and the
    few-shot features see the pixels `keras_vit.images.model_inputs` gives."""
    import tensorflow as tf

    from keras_vit import images as images_lib
    from keras_vit.training import augment
    from keras_vit.training import reporting
    from tests.training_helpers import plan_of

    scale = {"op": "to_model_range"}
    assert scale in _plan("deit").augmentation
    assert "normalization" not in json.dumps(_plan("deit").to_dict()["augmentation"])
    assert "normalised" not in reporting.describe(_plan("deit"))
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (10, 8, 8, 3)).astype(np.uint8)
    source = data_lib.open_source(TrainConfig.create("scratch", model=TINY), (pixels, np.arange(10) % 2))
    for normalization in ("minus_one_to_one", "imagenet", "clip"):
        config = TrainConfig.create("scratch", model=TINY.replace(patch_size=1, pixel_normalization=normalization),
                                    train_augment="none", image_size=(8, 8))
        plan = plan_lib.resolve(config, source)
        expected_op = scale if normalization == "minus_one_to_one" else {**scale, "normalization": normalization}
        assert plan.pixel_normalization == normalization
        assert [op for op in plan.augmentation if op["op"] == "to_model_range"] == [expected_op]
        want = images_lib.normalize(pixels.astype(np.float32), normalization)
        trained = augment.example_transform(plan)(tf.constant(pixels[0], tf.float32), tf.constant([1, 2], tf.int64))
        np.testing.assert_allclose(trained.numpy(), want[0], atol=1e-5)
        evaluated = next(iter(data_lib.plain_dataset(source, plan, "train", 9)))["image"].numpy()
        np.testing.assert_allclose(evaluated[0], want[0], atol=1e-5)
    assert "pixels normalised as clip" in reporting.describe(plan)
    # A [-1, 1] plan's ops are those of every earlier run (the same dicts, byte for byte in config.json).
    assert plan_of(source, (8, 8), 3).to_dict()["augmentation"] == [{"op": "resize"}, scale]


def test_the_classifier_is_the_users_else_the_recipes_from_scratch_and_pre_trained_weights_keep_theirs(tmp_path):
    """#38 item 3: who chose the classifier is known, not guessed by comparing the
    recipe with RECIPES (finetune_ld's own "gap" made a user's --classifier gap
    against token-classifier weights pass unnoticed)."""
    import keras_vit
    from keras_vit.training.transfer import resolve_weights
    from keras_vit.variants import get_variant

    scratch = TrainConfig.create("finetune_ld", model="Mu/4")
    assert RECIPES["finetune_ld"].classifier == "gap" != get_variant("Mu/4").classifier
    assert plan_lib.model_config(scratch).classifier == "gap"  # the recipe's, from scratch
    assert plan_lib.model_config(scratch.replace(classifier="token")).classifier == "token"  # the user's wins
    assert plan_lib.model_config(TrainConfig.create("finetune", model="Mu/4")).classifier == "token"  # the variant's

    path = str(tmp_path / "token.keras")
    keras_vit.ViT(TINY, image_size=14, num_classes=3).save(path)
    initial = resolve_weights(path)
    fine_tuned = TrainConfig.create("finetune_ld", weights=path)
    assert plan_lib.model_config(fine_tuned, initial).classifier == "token"  # the recipe's "gap" yields
    with pytest.raises(UserError, match=r"classifier='gap' contradicts the pre-trained weights \(.*\), whose "
                                        r"classifier is 'token': drop classifier"):
        plan_lib.model_config(fine_tuned.replace(classifier="gap"), initial)


def test_the_plan_holds_what_the_trainer_reads(tmp_path):
    """Evaluation steps, steps per host loop, the strategy and the shuffle are the plan's."""
    import tensorflow as tf

    config = tiny_config(tmp_path / "run", steps=2, log_every=3, eval_batch_size=300, strategy="auto")
    plan = plan_lib.resolve(config, data_lib.open_source(config), strategy="one_device")
    assert (plan.eval_steps, plan.steps_per_loop, plan.strategy, plan.shuffle) == (4, 3, "one_device", "permutation")
    assert plan_lib.resolve(config.replace(steps_per_loop=5), data_lib.open_source(config)).steps_per_loop == 5
    pixels = tf.data.Dataset.from_tensor_slices((np.zeros((20, 8, 8, 1), np.uint8), np.arange(20) % 2))
    assert plan_lib.resolve(config.replace(image_size=8, model=TINY.replace(patch_size=4)),
                            data_lib.open_source(config, pixels)).shuffle == "buffer"


@pytest.mark.slow
def test_config_json_holds_the_settings_as_given_and_the_plan_once(tmp_path):
    config = tiny_config(tmp_path / "run", steps=2, log_every=3, eval_batch_size=300, strategy="auto")
    train(config)
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "resolved" not in written and written["plan"]["eval_steps"] == 4
    # "auto" resolved by the trainer: one CPU, no GPU
    assert (written["plan"]["strategy"], written["plan"]["steps_per_loop"]) == ("one_device", 3)
    assert {k: v for k, v in written.items() if k != "plan"} == json.loads(json.dumps(config.to_dict()))


def test_a_classifier_chosen_in_a_run_written_before_its_field_existed_is_read_as_the_users():
    """Runs written before #38 kept a user's --classifier in the recipe: resumed, the
    settings read as given, and no change is recorded for an unchanged command."""
    from keras_vit import runs
    from keras_vit.training.config import upgraded

    now = TrainConfig.create("scratch", model="Mu/4", classifier="token").to_dict()
    before = {k: v for k, v in now.items() if k != "classifier"}
    before["recipe"] = {**now["recipe"], "classifier": "token"}  # scratch's own is "gap"
    read = TrainConfig.from_dict(before)
    assert (read.classifier, read.recipe.classifier) == ("token", "gap")
    assert runs.changed_settings(upgraded(before), now) == {}
    untouched = {k: v for k, v in TrainConfig.create("scratch", model="Mu/4").to_dict().items() if k != "classifier"}
    assert TrainConfig.from_dict(untouched).classifier is None
