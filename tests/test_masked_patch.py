"""Masked patch prediction: the corruption, the colour targets, the loss, the
recipe, the exported encoder, and a short self-supervised run on the bundled
MNIST digits whose few-shot features beat the same model at random init."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.tasks import ModelPlan
from keras_vit.layers.patch_corruption import KEPT, MASKED, RANDOM, PatchCorruption
from keras_vit.model import ViT
from keras_vit.training import train
from keras_vit.training.config import MASKED_PATCH, TrainConfig
from keras_vit.tasks import masked_patch as mpp
from keras_vit.training.transfer import apply_weights, resolve_weights
from tests.conftest import tiny_config

# --- corruption -----------------------------------------------------------------


def test_corruption_statistics_over_many_draws():
    batch, num_tokens, width, draws = 32, 64, 4, 25
    tokens = np.arange(batch * num_tokens * width, dtype="float32").reshape(batch, num_tokens, width)
    layer = PatchCorruption(seed=1)  # the paper's 50% / 80% / 10% / 10%
    corrupted_total = np.zeros(num_tokens)
    kinds_count = {KEPT: 0, MASKED: 0, RANDOM: 0}
    offsets = []
    for _ in range(draws):
        out, corrupted, kinds = (keras.ops.convert_to_numpy(t) for t in layer(tokens))
        np.testing.assert_array_equal(corrupted.sum(1), num_tokens // 2)  # exactly 50% of every image
        corrupted_total += corrupted.sum(0)
        for kind in kinds_count:
            kinds_count[kind] += int(np.sum((kinds == kind) & (corrupted == 1)))
        # A "random other patch" is a copy of another position of the same image.
        for b, i in zip(*np.nonzero(kinds == RANDOM)):
            sources = np.nonzero(np.all(tokens[b] == out[b, i], axis=-1))[0]
            assert len(sources) == 1 and sources[0] != i
            offsets.append((sources[0] - i) % num_tokens)
    total = batch * draws * num_tokens // 2
    assert sum(kinds_count.values()) == total  # 25,600 corrupted patches
    # Binomial standard deviations: 0.0025 (80%) and 0.0019 (10%); tolerances ~6 sigma.
    assert kinds_count[MASKED] / total == pytest.approx(0.8, abs=0.015)
    assert kinds_count[RANDOM] / total == pytest.approx(0.1, abs=0.012)
    assert kinds_count[KEPT] / total == pytest.approx(0.1, abs=0.012)
    # No position is favoured (800 draws per position: sigma 0.018).
    rates = corrupted_total / (batch * draws)
    assert rates.min() > 0.4 and rates.max() < 0.6
    # The source is spread over all the other positions, never the position itself.
    assert set(offsets) == set(range(1, num_tokens))


def _tiny_mpp_model(num_channels=3, **corruption):
    task = mpp.MaskedPatchTask(**corruption)
    return task, task.build_model(ModelPlan(tiny_config(), (16, 16), 10, num_channels))


def test_corrupted_patches_are_hidden_from_the_model():
    # All corrupted patches replaced by [mask]: the content of a corrupted
    # patch cannot change any output, while that of a kept patch does.
    task, model = _tiny_mpp_model(mask_rate=1.0, random_rate=0.0)
    images = np.random.default_rng(0).uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    state = model.corruption.seed_generator.state
    start = state.numpy()
    first = model(images)
    corrupted = keras.ops.convert_to_numpy(first["corrupted"])[0].reshape(4, 4)  # grid of image 0
    r, c = np.argwhere(corrupted == 1)[0]
    kr, kc = np.argwhere(corrupted == 0)[0]
    hidden, visible = images.copy(), images.copy()
    hidden[0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] = 0.5
    visible[0, 4 * kr:4 * kr + 4, 4 * kc:4 * kc + 4] = 0.5
    state.assign(start)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(hidden)["logits"]),
                               keras.ops.convert_to_numpy(first["logits"]), atol=1e-6)
    state.assign(start)
    assert not np.allclose(keras.ops.convert_to_numpy(model(visible)["logits"])[0],
                           keras.ops.convert_to_numpy(first["logits"])[0], atol=1e-4)
    assert first["logits"].shape == (2, 16, 512)


# --- targets --------------------------------------------------------------------


def test_512_class_targets_against_a_hand_computed_patch():
    # An 8x8 RGB image of four 4x4 patches, pixels given in [0, 1] then mapped to [-1, 1].
    unit = np.zeros((1, 8, 8, 3), "float32")
    # Patch (0, 0): R half 0.1, half 0.5 (mean 0.3 -> level floor(2.4) = 2); G all 1.0
    # (-> 8, clipped to 7); B all 0 (-> 0). Class 2*64 + 7*8 + 0 = 184.
    unit[0, :2, :4, 0], unit[0, 2:4, :4, 0] = 0.1, 0.5
    unit[0, :4, :4, 1] = 1.0
    # Patch (0, 1), token 1: mean (0.5, 0.25, 0.874): levels (4, 2, 6) -> 4*64 + 2*8 + 6 = 278.
    unit[0, :4, 4:] = (0.5, 0.25, 0.874)
    # Patch (1, 0), token 2: one bright pixel 0.8 among zeros: mean 0.05 -> level 0 in all channels.
    unit[0, 4, 0] = 0.8
    # Patch (1, 1), token 3: all 0.999 -> level 7 in all channels -> 511.
    unit[0, 4:, 4:] = 0.999
    images = unit * 2.0 - 1.0
    targets = mpp.mean_colour_targets(images, patch_size=4).numpy()
    np.testing.assert_array_equal(targets, [[184, 278, 0, 511]])
    assert mpp.num_colour_classes(3) == 512


def test_grayscale_targets_are_the_3_bit_mean_intensity():
    unit = np.zeros((1, 4, 8, 1), "float32")
    unit[0, :, :4] = 0.3   # level 2
    unit[0, :2, 4:] = 1.0  # mean 0.5 -> level 4
    targets = mpp.mean_colour_targets(unit * 2 - 1, patch_size=4).numpy()
    np.testing.assert_array_equal(targets, [[2, 4]])
    assert mpp.num_colour_classes(1) == 8


# --- loss -----------------------------------------------------------------------


def test_only_corrupted_positions_contribute_to_the_loss():
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(3, 6, 8)).astype("float32"))
    targets = tf.constant(rng.integers(0, 8, size=(3, 6)), tf.int32)
    corrupted = tf.constant([[1, 0, 1, 0, 0, 1], [0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]], tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss, metrics = mpp.masked_patch_loss(logits, targets, corrupted)
    grad = tape.gradient(loss, logits).numpy()
    # The mean cross-entropy over each example's corrupted patches, by hand.
    z = logits.numpy()
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets.numpy()[..., None], -1)[..., 0]
    c = corrupted.numpy()
    np.testing.assert_allclose(loss.numpy(), (nll * c).sum(1) / c.sum(1), rtol=1e-5)
    assert set(metrics) == {"accuracy", "top5"}
    # No gradient reaches the predictions at uncorrupted positions; every corrupted one gets some.
    assert np.all(grad[c == 0] == 0.0)
    assert np.all(np.abs(grad[c == 1]).sum(-1) > 0)
    # Any logits there, even non-finite ones, leave loss and metrics unchanged.
    changed = np.where(c[..., None] == 0, rng.normal(scale=100.0, size=z.shape), z).astype("float32")
    changed[0, 1, 0] = np.inf
    changed_loss, changed_metrics = mpp.masked_patch_loss(tf.constant(changed), targets, corrupted)
    np.testing.assert_array_equal(changed_loss.numpy(), loss.numpy())
    for name in metrics:
        np.testing.assert_array_equal(changed_metrics[name].numpy(), metrics[name].numpy())


def test_task_loss_reads_images_not_labels():
    task, model = _tiny_mpp_model(num_channels=1)
    images = np.random.default_rng(1).uniform(-1, 1, size=(4, 16, 16, 1)).astype("float32")
    state = model.corruption.seed_generator.state
    start = state.numpy()
    loss, metrics = task.compute_loss(model, {"image": images, "label": np.zeros(4, "int32")}, training=True)
    state.assign(start)
    other, _ = task.compute_loss(model, {"image": images, "label": np.full(4, 7, "int32")}, training=True)
    assert loss.shape == (4,) and np.all(np.isfinite(loss.numpy()))
    np.testing.assert_array_equal(loss.numpy(), other.numpy())
    assert model.colour_head.units == 8  # grayscale: 3 bits of one channel


def test_recipe_has_the_papers_defaults_and_takes_overrides():
    recipe = MASKED_PATCH
    assert (recipe.optimizer, recipe.learning_rate, recipe.batch_size, recipe.weight_decay) == ("adam", 2e-4, 4096, 0)
    assert (recipe.warmup_steps, recipe.schedule, recipe.steps) == (10_000, "cosine", 1_000_000)
    config = TrainConfig.create(recipe, learning_rate=1e-3, batch_size=64, model="Mu/4")
    assert config.recipe.learning_rate == 1e-3 and config.recipe.name == "masked_patch"


# --- a real run -------------------------------------------------------------------

MNIST_STEPS = 1000


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory):
    # 7x7 patches (16 tokens) keep a step cheap; ~40 s of training on one CPU core.
    workdir = str(tmp_path_factory.mktemp("mpp"))
    config = TrainConfig.create(
        "masked_patch", model=tiny_config(patch_size=7, hidden_size=64, mlp_dim=128), dataset="mnist5k",
        workdir=workdir, steps=MNIST_STEPS, batch_size=64, learning_rate=3e-3, warmup_steps=100, image_size=None,
        train_augment="none", classifier="gap", checkpoint_every=10**6, log_every=100, eval_batch_size=500,
        fewshot_shots=(5, 25), fewshot_pool=1000, progress=False)
    task = mpp.MaskedPatchTask()
    return config, train(config, task=task), task


@pytest.mark.slow
def test_short_mnist_run_gives_better_few_shot_features_than_random_init(mnist_run):
    config, results, task = mnist_run
    with open(os.path.join(config.workdir, "results.json")) as f:
        written = json.load(f)
    assert written["fewshot"] == results["fewshot"]
    assert written["fewshot_random_init"] == results["fewshot_random_init"]
    assert results["steps"] == MNIST_STEPS
    # The objective was learned: better than always predicting the commonest level.
    assert results["eval"]["accuracy"] > 0.5
    pretrained, random_init = results["fewshot"], results["fewshot_random_init"]
    # Seen: 5-shot 0.39 vs 0.29, 25-shot 0.52 vs 0.45 (1,000 test digits).
    gains = [pretrained[k] - random_init[k] for k in ("5shot", "25shot")]
    assert min(gains) > 0.03 and np.mean(gains) > 0.05, (pretrained, random_init)


@pytest.mark.slow
def test_exported_model_is_a_vit_whose_encoder_loads_for_fine_tuning(mnist_run):
    config, results, task = mnist_run
    exported = keras.models.load_model(results["model_path"], compile=False)
    assert isinstance(exported, ViT) and exported.num_channels == 1
    assert not any("colour" in v.path or "mask_embedding" in v.path for v in exported.variables)
    # What `--weights <workdir>` does: the encoder into a new classifier, the head new and zero.
    initial = resolve_weights(config.workdir)
    finetune = ViT(initial.source_config, image_size=(28, 28), num_classes=3, num_channels=1)
    apply_weights(finetune, initial)
    for name in ("patch_embedding", "position_embedding", "encoder"):
        for a, b in zip(getattr(finetune, name).weights, getattr(exported, name).weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.any(finetune.head.kernel.numpy())
    # It was trained: it is not the run's random initialisation any more.
    changed = [not np.allclose(a, b) for a, b in zip(task._initial_weights, exported.get_weights())]
    assert sum(changed) > len(changed) // 2


def test_the_recipe_name_picks_the_task():
    from keras_vit.training.config import TrainConfig
    from keras_vit.tasks import ClassificationTask, make_task

    config = TrainConfig.create("masked_patch", model="Mu/4", dataset="mnist5k", workdir="w")
    assert isinstance(make_task(config), mpp.MaskedPatchTask)
    assert isinstance(make_task(TrainConfig.create("scratch", model="Mu/4", dataset="mnist5k", workdir="w")),
                      ClassificationTask)


def test_targets_are_the_same_colours_whatever_the_models_pixel_normalization():
    """A model taking ImageNet- or CLIP-normalised pixels (DeiT, DINOv2, CLIP
    weights) gets the colour classes of the same pixels."""
    from keras_vit import images as images_lib

    pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3)).astype("float32")
    want = mpp.mean_colour_targets(images_lib.to_model_range(pixels), patch_size=4).numpy()
    for normalization in ("minus_one_to_one", "imagenet", "clip"):
        images = mpp.in_model_range(images_lib.normalize(pixels, normalization), normalization)
        np.testing.assert_array_equal(mpp.mean_colour_targets(images, patch_size=4).numpy(), want)
