"""Issue #24's training pieces against hand-computed references: weight decay
on kernels only, layer-wise learning rates, the weights' moving average (and
that evaluation and model.keras use it), the sigmoid loss, mixed targets,
learning-rate scaling with the batch and --epochs."""

import json
import math

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.tasks import ModelPlan
from keras_vit.model import ViT
from keras_vit.training import TrainConfig, train
from keras_vit.training import optimization
from keras_vit.tasks.classification import ClassificationTask
from keras_vit.variants import get_variant
from tests.training_helpers import TINY, checkpoint_arrays, tiny_config

DEEP = TINY.replace(num_layers=3, classifier="token")


def _model(config=DEEP):
    return ViT(get_variant(config), image_size=(28, 28), num_classes=10, num_channels=1)


def _recipe(**fields):
    settings = dict(optimizer="sgd", momentum=0.0, learning_rate=0.1, schedule="constant", warmup_steps=0,
                    weight_decay=0.0)
    settings.update(fields)
    return TrainConfig.create("scratch", **settings).recipe


def _step(model, optimizer, gradient=0.0):
    before = {v.path: v.numpy() for v in model.trainable_variables}
    optimizer.apply([tf.fill(v.shape, gradient) for v in model.trainable_variables], model.trainable_variables)
    return before, {v.path: v.numpy() for v in model.trainable_variables}


def test_weight_decay_reaches_kernels_only():
    model = _model()
    optimizer = optimization.make_optimizer(_recipe(optimizer="adamw", weight_decay=0.5), "float32", model)
    before, after = _step(model, optimizer)  # zero gradients: only the decay moves anything
    for path in before:
        if path.endswith("/kernel"):
            np.testing.assert_allclose(after[path], before[path] * (1 - 0.1 * 0.5), rtol=1e-6, err_msg=path)
        else:  # biases, norms, class token, position embedding
            np.testing.assert_array_equal(after[path], before[path], err_msg=path)
    assert any("pos_embedding" in p for p in before) and any(p.startswith("cls") for p in before)


def test_layer_decay_scales_each_depth_geometrically():
    model = _model()
    rate = 0.5
    optimizer = optimization.make_optimizer(_recipe(layer_decay=rate), "float32", model)
    before, after = _step(model, optimizer, gradient=1.0)  # plain SGD: the step is -lr x scale
    expected = {"embedding/projection/kernel": rate ** 4, "cls/cls": rate ** 4,
                "posembed_input/pos_embedding": rate ** 4,
                "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": rate ** 3,
                "Transformer/encoderblock_2/LayerNorm_0/gamma": rate ** 1,
                "Transformer/encoder_norm/gamma": 1.0, "head/kernel": 1.0}
    for path, scale in expected.items():
        np.testing.assert_allclose(before[path] - after[path], 0.1 * scale, rtol=1e-5, err_msg=path)


@pytest.mark.parametrize("fields", [dict(optimizer="sgd", momentum=0.9), dict(optimizer="adam", momentum=0.9),
                                    dict(optimizer="adamw", momentum=0.9)], ids=lambda f: f["optimizer"])
@pytest.mark.slow
def test_layer_decay_is_the_base_rule_at_a_scaled_rate(fields):
    # Two steps (so that momenta count): each variable moves as the same
    # optimizer without layer decay moves it at learning rate x its scale.
    rate, scale = 0.5, {"head/kernel": 1.0, "Transformer/encoderblock_1/LayerNorm_0/gamma": 0.25,
                        "posembed_input/pos_embedding": 0.0625}
    moved = {}
    for lr_scale in (None, *sorted(set(scale.values()))):
        model = _model()
        decay = dict(layer_decay=rate) if lr_scale is None else dict(learning_rate=0.1 * lr_scale)
        optimizer = optimization.make_optimizer(_recipe(**fields, **decay), "float32", model)
        start, _ = _step(model, optimizer, gradient=1.0)
        _, end = _step(model, optimizer, gradient=-0.5)
        moved[lr_scale] = {p: end[p] - start[p] for p in scale}
    for path, s in scale.items():
        np.testing.assert_allclose(moved[None][path], moved[s][path], rtol=1e-5, atol=1e-8, err_msg=path)


def test_layer_decay_optimizers_serialise_and_checkpoint_as_their_base_rule():
    import keras

    from keras_vit.training.checkpointing import variable_keys

    model = _model()
    recipe = _recipe(optimizer="adamw", weight_decay=0.05, ema=0.9, layer_decay=0.5)
    optimizer = optimization.make_optimizer(recipe, "float32", model)
    loaded = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(loaded) is optimization.LayerDecayAdamW and loaded.get_config() == optimizer.get_config()
    assert loaded.layer_scales["cls/cls"] == 0.5 ** 4 and loaded.layer_scales["head/kernel"] == 1.0
    # The same checkpoint names and fingerprint as AdamW alone: runs from before LayerDecay resume.
    plain = optimization.make_optimizer(_recipe(optimizer="adamw", weight_decay=0.05, ema=0.9), "float32", model)
    for o in (optimizer, plain):
        o.build(model.trainable_variables)
    assert (variable_keys([v.path for v in optimizer.variables], "optimizer")
            == variable_keys([v.path for v in plain.variables], "optimizer"))
    assert optimization.rule_name(optimizer) == optimization.rule_name(plain) == "AdamW"
    loss_scaled = optimization.make_optimizer(recipe, "mixed_float16", model)
    assert optimization.rule_name(loss_scaled) == "AdamW"


def test_the_moving_average_is_the_hand_computed_one_and_swaps_in_and_out():
    model = _model()
    optimizer = optimization.make_optimizer(_recipe(ema=0.9), "float32", model)
    kernel = model.head.kernel
    values = [kernel.numpy()]
    for gradient in (1.0, -2.0, 0.5):
        _step(model, optimizer, gradient)
        values.append(kernel.numpy())
    # Keras' EMA starts at the first step's weights, then average = 0.9 average + 0.1 w.
    average = values[1]
    for w in values[2:]:
        average = 0.9 * average + 0.1 * w
    with optimization.averaged_weights(model, optimizer):
        np.testing.assert_allclose(kernel.numpy(), average, rtol=1e-5)
    np.testing.assert_array_equal(kernel.numpy(), values[-1])


@pytest.mark.slow
def test_ema_runs_evaluate_and_export_the_average_and_checkpoint_both(tmp_path):
    import keras

    results = train(tiny_config(tmp_path, ema=0.5, steps=4, learning_rate=3e-2))
    arrays = checkpoint_arrays(tmp_path / "checkpoints" / "ckpt-00000004.npz")
    meta = json.loads(str(np.load(tmp_path / "checkpoints" / "ckpt-00000004.npz")["meta"]))
    names = [n for n, _, _ in meta["optimizer_variables"]]
    averages = {n: arrays[f"optimizer/{i:05d}"] for i, n in enumerate(names) if n.endswith("_average")}
    exported = {w.path: w.numpy() for w in keras.models.load_model(results["model_path"]).trainable_weights}
    trained = {n: arrays[f"model/{i:05d}"] for i, (n, _, _) in enumerate(meta["model_variables"])}
    head = next(n for n in averages if n.endswith("head_kernel_average"))
    np.testing.assert_array_equal(exported["head/kernel"], averages[head])
    assert not np.array_equal(exported["head/kernel"], trained["head/kernel"])
    # The recorded evaluation is the exported (averaged) model's.
    from keras_vit.training.data import load_mnist5k

    _, (images, labels) = load_mnist5k()
    logits = keras.models.load_model(results["model_path"]).predict(images / 127.5 - 1.0, batch_size=500, verbose=0)
    assert np.mean(np.argmax(logits, -1) == labels) == pytest.approx(results["eval"]["accuracy"], abs=1e-3)


def test_sigmoid_loss_is_the_summed_binary_cross_entropy_from_a_minus_log_c_bias():
    task = ClassificationTask(loss="sigmoid")
    model = task.build_model(ModelPlan(TINY, (28, 28), 10, 1))
    np.testing.assert_allclose(model.head.bias.numpy(), -math.log(10), rtol=1e-6)
    images = tf.random.stateless_uniform([4, 28, 28, 1], [1, 2], -1, 1)
    batch = {"image": images, "label": tf.constant([0, 3, 9, 3])}
    loss, _ = task.compute_loss(model, batch, training=False)
    z = model(images).numpy().astype(np.float64)
    y = np.eye(10)[[0, 3, 9, 3]]
    expected = np.sum(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))), axis=-1)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_mixed_targets_weigh_both_labels_then_smooth():
    task = ClassificationTask(label_smoothing=0.1)
    batch = {"label": tf.constant([1, 2]), "mix_label": tf.constant([2, 1]), "mix_lambda": tf.constant([0.7, 0.7])}
    targets = task.targets(batch, 4, training=True).numpy()
    np.testing.assert_allclose(targets[0], np.array([0, 0.7, 0.3, 0]) * 0.9 + 0.025, rtol=1e-6)


@pytest.mark.slow
def test_learning_rate_scales_with_the_batch_and_epochs_become_steps(tmp_path):
    recipe = _recipe(learning_rate=5e-4, lr_base_batch=512, batch_size=1024)
    assert recipe.peak_learning_rate == pytest.approx(1e-3)
    assert optimization.make_optimizer(recipe)._learning_rate.peak == pytest.approx(1e-3)
    # 4,000 digits x 0.1 epoch / 16 per step = 25 steps.
    results = train(tiny_config(tmp_path, epochs=0.1, batch_size=16, checkpoint_every=100))
    assert results["steps"] == 25 and results["plan"]["steps"] == 25 and results["plan"]["recipe"]["steps"] == 25


@pytest.mark.slow
def test_any_batch_mixes_and_a_resume_inside_a_mixing_group_mixes_as_before():
    """Mixup/CutMix groups (2 x repeated_augmentation = 4 here) may span
    batches of 5; a stream resumed in the middle of a group (15 examples
    consumed) yields what the uninterrupted stream yields from there."""
    import tensorflow as tf

    from keras_vit.training import data as data_lib
    from tests.training_helpers import plan_of

    config = tiny_config("unused", batch_size=5, mixup=0.8, cutmix=1.0, repeated_augmentation=2, random_erasing=0.25,
                         randaugment=(2, 9), train_augment="inception_crop_flip")
    source = data_lib.open_source(config)
    plan = plan_of(source, (28, 28), 1, config)
    context = tf.distribute.InputContext(1, 0, 1)
    whole = [b for b in data_lib.train_dataset(source, plan, context, 0).take(6).as_numpy_iterator()]
    resumed = [b for b in data_lib.train_dataset(source, plan, context, 15).take(3).as_numpy_iterator()]
    for a, b in zip(whole[3:], resumed):
        for key in ("image", "label", "mix_label", "mix_lambda"):
            np.testing.assert_array_equal(a[key], b[key])
    assert any((b["mix_lambda"] < 1).any() for b in whole)  # mixed at all


