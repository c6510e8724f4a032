"""Examples with named fields (keras_vit.tasks.fields): a mask moves with every crop, flip,
affine, translation and geometric RandAugment op of its image, and a Task with a mask per
example (tests/pixel_task.py) trains from a list: with a mask column and resumes bitwise."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit.errors import UserError
from keras_vit.tasks.fields import IGNORE
from keras_vit.training import TrainConfig, augment
from keras_vit.training import plan as plan_lib
from keras_vit.training.sources import open_source

from tests.pixel_task import PixelTask
from tests.training_helpers import TINY, weights_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLOURS = np.array([[200, 30, 30], [30, 200, 30], [30, 30, 200]], np.uint8)


@pytest.fixture(scope="module")
def mask_list(tmp_path_factory):
    """30 photos of 3 coloured regions (28 x 28) and their class masks (PNG mode L), listed as image,mask."""
    folder = tmp_path_factory.mktemp("masks")
    rng = np.random.default_rng(0)
    rows = ["image,mask"]
    for i in range(30):
        mask = np.zeros((28, 28), np.uint8)
        mask[:, rng.integers(6, 22):] = 1
        top, left = rng.integers(0, 16, size=2)
        mask[top:top + 10, left:left + 10] = 2
        Image.fromarray(COLOURS[mask]).save(folder / f"{i}.png")
        Image.fromarray(mask, mode="L").save(folder / f"{i}_mask.png")
        rows.append(f"{i}.png,{i}_mask.png")
    (folder / "train.csv").write_text("\n".join(rows) + "\n")
    return str(folder / "train.csv")


def _plan(mask_list, **settings):
    config = TrainConfig.create("scratch", model=TINY.replace(patch_size=4), dataset=f"list:{mask_list}",
                                num_classes=3, image_size=28, workdir="unused", **settings)
    task = PixelTask()
    return plan_lib.resolve(config, open_source(config, fields=task.fields), task=task)


def _classes_of(image):
    """Each pixel's class by its nearest colour (model range [-1, 1] back to 0..255)."""
    pixels = (np.asarray(image) + 1.0) * 127.5
    return np.argmin(((pixels[:, :, None, :] - COLOURS[None, None].astype(float)) ** 2).sum(-1), axis=-1)


@pytest.mark.parametrize("train_augment", ["inception_crop_flip", "affine", "translate"])
def test_the_mask_moves_with_its_image(mask_list, train_augment):
    plan = _plan(mask_list, train_augment=train_augment, randaugment=None)
    transform = augment.fields_transform(plan)
    source = plan.source
    moved = ignored = 0
    for i, raw in enumerate(source.examples("train", 0, 1).take(8)):
        example, ok = source.decode(raw)
        example = {"image": tf.cast(example["image"], tf.float32), "mask": example["mask"]}
        out = transform(example, tf.constant([3, i], tf.int64))
        mask = out["mask"].numpy()
        assert out["mask"].dtype == tf.int32 and mask.shape == (28, 28)
        known = mask != IGNORE
        # Nearest for the mask, bilinear for the image: they disagree on region borders only.
        assert np.mean(_classes_of(out["image"])[known] == mask[known]) > 0.9
        moved += not np.array_equal(mask, example["mask"].numpy())
        ignored += int((~known).sum())
    assert moved >= 4  # the geometry did move the masks
    assert (ignored > 0) == (train_augment == "affine")  # only the affine brings pixels in from outside


def test_geometric_randaugment_moves_the_mask_and_photometric_leaves_it(mask_list):
    mask = np.tile(np.arange(28, dtype=np.float32)[None, :] // 7, (28, 1))  # 4 vertical bands
    image = tf.constant(np.repeat(mask[:, :, None] * 60.0, 3, axis=-1))
    names, kinds = sorted(augment.OPS), set()
    for s in range(40):
        seed = tf.constant([s, 1], tf.int64)
        name = names[int(tf.random.stateless_uniform([], augment.fold(seed, 0), 0, len(names), dtype=tf.int32))]
        out, (moved,) = augment.randaugment(image, 1, 15, seed, maps=[(tf.constant(mask[:, :, None]), 255.0)])
        moved = moved.numpy()[..., 0]
        if name in augment.MATRICES:
            known = moved != 255
            bands = np.round(out.numpy()[..., 0] / 60.0)
            assert np.mean(bands[known] == moved[known]) > 0.9, name
            kinds.add("geometric")
        else:
            np.testing.assert_array_equal(moved, mask, err_msg=name)
            kinds.add("photometric")
    assert kinds == {"geometric", "photometric"}


def test_the_plan_refuses_mixing_a_mask_and_names_missing_fields(mask_list):
    with pytest.raises(UserError, match=r"mask \(mask\) cannot be mixed: give mixup=0 and cutmix=0"):
        _plan(mask_list, mixup=0.8)
    config = TrainConfig.create("scratch", model=TINY, dataset="mnist5k", workdir="unused")
    with pytest.raises(UserError, match="reads the field.s. mask of each example, and mnist5k gives image, label"):
        plan_lib.resolve(config, open_source(config), task=PixelTask())


def _cli(*args):
    done = subprocess.run([sys.executable, "-m", "keras_vit_cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _train(mask_list, workdir, steps):
    return _cli("train", "--task", "tests.pixel_task:PixelTask", "--dataset", f"list:{mask_list}", "--num-classes",
                "3", "--model", "Nano/4", "--image-size", "28", "--steps", steps, "--batch-size", "8",
                "--checkpoint-every", "2", "--workdir", workdir, "--recipe", "scratch", "--no-progress", "--no-jit",
                "--eval-batch-size", "8", "--train-augment", "inception_crop_flip")


@pytest.fixture(scope="module")
def mask_runs(mask_list, tmp_path_factory):
    """A run of the pixel Task straight to step 4, and one stopped at 2 and resumed to 4."""
    root = tmp_path_factory.mktemp("mask_runs")
    whole = _train(mask_list, root / "whole", 4)
    _train(mask_list, root / "halves", 2)
    _train(mask_list, root / "halves", 4)
    return root, whole


@pytest.mark.slow
def test_a_mask_task_trains_and_resumes_bitwise_through_the_cli(mask_runs):
    root, whole = mask_runs
    for a, b in zip(weights_of(root / "whole" / "model.keras"), weights_of(root / "halves" / "model.keras")):
        np.testing.assert_array_equal(a, b)
    results = json.loads((root / "whole" / "results.json").read_text())
    assert results["plan"]["task"] == "tests.pixel_task:PixelTask"
    assert results["plan"]["fields"] == {"image": "image", "mask": "mask"}
    assert 0.0 <= results["eval"]["pixel_accuracy"] <= 1.0 and results["eval"]["num_examples"] == 3
    assert "eval pixel accuracy" in whole.stdout and '"pixel_accuracy"' in whole.stdout


@pytest.mark.slow
def test_evaluate_and_predict_read_the_run_s_task(mask_runs, mask_list):
    import keras

    import keras_vit  # noqa: F401  (registers the layers model.keras holds)

    run = mask_runs[0] / "whole"
    figures = json.loads(_cli("evaluate", run, mask_list, "--json").stdout)
    assert figures["task"] == "pixel_classes" and figures["num_examples"] == 30  # every row of the list
    # The same figures by hand: the model's argmax against each mask, resized as the run evaluated.
    model = keras.models.load_model(run / "model.keras")
    folder = os.path.dirname(mask_list)
    hits = []
    for i in range(30):
        image = np.asarray(Image.open(os.path.join(folder, f"{i}.png")), np.float32) / 127.5 - 1.0
        mask = np.asarray(Image.open(os.path.join(folder, f"{i}_mask.png")))
        hits.append(np.mean(np.argmax(model(image[None]), -1)[0] == mask))
    assert figures["pixel_accuracy"] == pytest.approx(np.mean(hits), abs=1e-5)
    lines = _cli("predict", run, os.path.join(folder, "0.png")).stdout.splitlines()
    assert lines[0].endswith("0.png") and lines[1].strip().startswith("mask 28x28 (")
    predicted = json.loads(_cli("predict", run, os.path.join(folder, "0.png"), "--json").stdout)
    image = np.asarray(Image.open(os.path.join(folder, "0.png")), np.float32) / 127.5 - 1.0
    np.testing.assert_array_equal(predicted["mask"], np.argmax(model(image[None]), -1)[0])
    figures_dir = run.parent / "figures"
    done = _cli("inspect", run, "--image", os.path.join(folder, "0.png"), "--out", figures_dir)
    assert "the figures are its ViT's" in done.stdout and (figures_dir / "attention_heads.png").exists()
    # model.keras loads where only keras_vit is imported (PatchGridModel registered with the ViT).
    loaded = subprocess.run([sys.executable, "-c", f"import keras_vit; print(type(keras_vit.load_model({str(run)!r}))"
                                                   f".__name__)"], capture_output=True, text=True, timeout=300)
    assert loaded.stdout.strip().endswith("PatchGridModel"), loaded.stderr[-2000:]


@pytest.mark.slow
def test_export_serves_the_task_s_outputs_from_a_fresh_process(mask_runs, mask_list, tmp_path):
    run, out = mask_runs[0] / "whole", tmp_path / "exports"
    done = _cli("export", run, "--out", out, "--data", os.path.dirname(mask_list))
    assert "saved_model" in done.stdout and (out / "whole" / "1" / "saved_model.pb").exists()
    refused = subprocess.run([sys.executable, "-m", "keras_vit_cli", "export", str(run), "--out", str(tmp_path / "x"),
                              "--formats", "tflite"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": ROOT})
    assert refused.returncode == 2 and "exports as saved_model only" in refused.stderr
    script = f"""
import json, sys, numpy as np, tensorflow as tf
from PIL import Image
served = tf.saved_model.load({str(out / "whole" / "1")!r})
pixels = np.asarray(Image.open({os.path.join(os.path.dirname(mask_list), "0.png")!r}), np.float32)[None]
encoded = open({os.path.join(os.path.dirname(mask_list), "0.png")!r}, "rb").read()
a = served.signatures["serving_default"](images=tf.constant(pixels))
b = served.signatures["serving_bytes"](image_bytes=tf.constant([encoded]))
print(json.dumps({{"mask": a["mask"].numpy().tolist(), "bytes_mask": b["mask"].numpy().tolist(),
                  "probabilities": a["probabilities"].numpy().tolist()}}))
"""
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    served = json.loads(fresh.stdout.splitlines()[-1])
    import keras

    import keras_vit  # noqa: F401

    model = keras.models.load_model(run / "model.keras")
    image = np.asarray(Image.open(os.path.join(os.path.dirname(mask_list), "0.png")), np.float32) / 127.5 - 1.0
    logits = np.asarray(model(image[None]))
    np.testing.assert_allclose(served["probabilities"], tf.nn.softmax(logits).numpy(), atol=1e-5)
    np.testing.assert_array_equal(served["mask"], np.argmax(logits, -1))
    np.testing.assert_array_equal(served["bytes_mask"], served["mask"])


@pytest.mark.slow
def test_a_quantised_task_run_is_read_by_its_task(mask_runs, mask_list, tmp_path):
    run, out = mask_runs[0] / "whole", tmp_path / "int8"
    folder = os.path.dirname(mask_list)
    done = _cli("quantize", run, "--mode", "int8", "--out", out, "--data", folder)
    report = json.loads((out / "quantization.json").read_text())
    agreement = report["agreement"]
    assert report["task"] == "pixel_classes" and agreement["max_abs_diff"] < 0.2, done.stdout  # probabilities
    assert agreement["equal"]["mask"] > 0.8 and "% the same" in done.stdout
    float_figures = json.loads(_cli("evaluate", run, mask_list, "--json").stdout)
    figures = json.loads(_cli("evaluate", out, mask_list, "--json").stdout)
    assert figures["task"] == "pixel_classes" and abs(figures["pixel_accuracy"] - float_figures["pixel_accuracy"]) < 0.1
    assert "mask 28x28" in _cli("predict", out, os.path.join(folder, "1.png")).stdout
    assert "saved_model" in _cli("export", out, "--out", tmp_path / "exports", "--data", folder).stdout


@pytest.mark.slow
def test_lora_and_layer_decay_adapt_the_encoder_of_a_task_with_its_own_head(digits_run, mask_list, tmp_path, capsys):
    import keras

    from keras_vit.training import train

    config = TrainConfig.create("finetune", weights=str(digits_run), dataset=f"list:{mask_list}", num_classes=3,
                                image_size=28, steps=2, batch_size=8, workdir=str(tmp_path / "lora"), lora_rank=2,
                                layer_decay=0.75, progress=False, jit_compile=False, strategy="default",
                                eval_batch_size=8, checkpoint_every=2, warmup_steps=0)
    results = train(config, task=PixelTask())
    assert "the run's model has a head of its own (pixel_vit), which starts anew" in capsys.readouterr().out
    # The ViT's LoRA factors and the pixel head train; the base, its channel converted, stays.
    head = 32 * 3 + 3  # Nano's width 32 -> 3 classes
    assert results["parameters"]["trainable"] == head + 2 * 2 * (32 + 32)  # rank 2 on query and value, one block
    assert "adapter_path" not in results  # the head is outside the ViT: model.keras is the run's model
    kept = keras.models.load_model(tmp_path / "lora" / "model.keras")
    assert kept.vit.config.lora_rank == 0 and kept.vit.num_channels == 1  # merged; the weights' channel


def test_a_row_whose_mask_is_missing_or_of_another_size_is_named_and_weighs_nothing(mask_list, tmp_path):
    folder = os.path.dirname(mask_list)
    Image.fromarray(np.zeros((20, 28), np.uint8), mode="L").save(tmp_path / "short.png")
    Image.fromarray(COLOURS[np.zeros((28, 28), np.uint8)]).save(tmp_path / "rgb_mask.png")
    rows = ["image,mask", f"{folder}/0.png,{folder}/0_mask.png", f"{folder}/1.png,{tmp_path}/missing.png",
            f"{folder}/2.png,{tmp_path}/short.png", f"{folder}/3.png,{tmp_path}/rgb_mask.png"]
    listed = tmp_path / "dirty.csv"
    listed.write_text("\n".join(rows) + "\n")
    config = TrainConfig.create("scratch", model=TINY, dataset=f"list:{listed},{listed}", num_classes=3,
                                workdir="unused")
    source = open_source(config, fields=PixelTask.fields)
    oks = [bool(ok) for _, ok in (source.decode(raw) for raw in source.examples("eval", 0, 1))]
    assert oks == [True, False, False, False]
    failed = source.problems.summary()["files"]
    assert set(failed) == {f"{folder}/1.png", f"{folder}/2.png", f"{folder}/3.png"}
    assert "short.png is 28x20 px and its image 28x28" in failed[f"{folder}/2.png"]
    assert "one channel" in failed[f"{folder}/3.png"]
    with pytest.raises(UserError, match="has no label column, so the classes are not known: give --num-classes N"):
        open_source(config.replace(num_classes=None), fields=PixelTask.fields)


def test_lists_and_masks_as_other_tools_write_them(mask_list, tmp_path):
    """A spreadsheet's "CSV UTF-8" (a byte-order mark, CRLF lines), a VOC-style palette mask whose
    border is 255 (void: ignored), a depth map as a .npy array; a mask of a class the run lacks."""
    from keras_vit.tasks.fields import DEPTH

    folder = os.path.dirname(mask_list)
    palette = Image.fromarray(np.pad(np.ones((26, 26), np.uint8), 1, constant_values=255), mode="P")
    palette.putpalette([0, 0, 0, 128, 0, 0] + [224, 224, 192] * 254)
    palette.save(tmp_path / "voc.png")
    np.save(tmp_path / "depth.npy", np.linspace(0.5, 10, 28 * 28, dtype=np.float32).reshape(28, 28))
    Image.fromarray(np.full((28, 28), 5, np.uint8), mode="L").save(tmp_path / "five.png")
    listed = tmp_path / "excel.csv"
    listed.write_bytes(("\ufeffimage,mask,depth\r\n"
                        f"{folder}/0.png,{tmp_path}/voc.png,{tmp_path}/depth.npy\r\n"
                        f"{folder}/1.png,{tmp_path}/five.png,{tmp_path}/depth.npy\r\n").encode("utf-8"))
    config = TrainConfig.create("scratch", model=TINY, dataset=f"list:{listed},{listed}", num_classes=3,
                                workdir="unused")
    source = open_source(config, fields={**PixelTask.fields, "depth": DEPTH})
    assert source.fields == ("image", "mask", "depth")
    (first, ok), (_, bad) = [source.decode(raw) for raw in source.examples("eval", 0, 1)]
    assert bool(ok) and not bool(bad)
    mask = first["mask"].numpy()
    assert mask[0, 0] == IGNORE and mask[5, 5] == 1  # the palette's indices, its void border kept as ignored
    np.testing.assert_allclose(first["depth"].numpy()[-1, -1], 10.0)
    reason = source.problems.summary()["files"][f"{folder}/1.png"]
    assert "five.png holds class 5, and the run has 3 classes (0..2; 255 marks pixels of no class): give " \
           "--num-classes 6, or relabel it" in reason


def test_a_dict_whose_mask_is_not_its_image_s_size_weighs_nothing():
    def rows():
        yield {"image": np.zeros((28, 28, 3), np.float32), "mask": np.ones((28, 28), np.int32), "id": 7}
        yield {"image": np.zeros((28, 28, 3), np.float32), "mask": np.ones((20, 28), np.int32), "id": 8}

    dataset = tf.data.Dataset.from_generator(rows, output_signature={
        "image": tf.TensorSpec((None, None, 3), tf.float32), "mask": tf.TensorSpec((None, None), tf.int32),
        "id": tf.TensorSpec((), tf.int64)})
    config = TrainConfig.create("scratch", model=TINY, num_classes=2, workdir="unused")
    source = open_source(config, dataset=(dataset, dataset), fields=PixelTask.fields)
    assert source.fields == ("image", "mask")  # "id" is no field of the Task's
    decoded = [source.decode(raw) for raw in source.examples("eval", 0, 1)]
    assert [bool(ok) for _, ok in decoded] == [True, False]
    assert decoded[1][0]["mask"].shape == (28, 28) and np.all(decoded[1][0]["mask"].numpy() == IGNORE)


def _mask_arrays(n, rng, side=28):
    masks = np.zeros((n, side, side), np.int32)
    for mask, cut in zip(masks, rng.integers(6, side - 6, size=n)):
        mask[:, cut:] = 1
    return COLOURS[masks].astype(np.float32), masks


@pytest.mark.slow
def test_a_dataset_of_dicts_gives_the_task_its_fields(tmp_path):
    from keras_vit.training import train

    rng = np.random.default_rng(1)
    images, masks = _mask_arrays(40, rng)
    fixed = tf.data.Dataset.from_tensor_slices({"image": images, "mask": masks, "caption": ["a"] * 40})

    def varying():  # two sizes: the spatial fields travel serialized
        for i in range(40):
            side = 28 if i % 2 else 35
            image, mask = _mask_arrays(1, rng, side)
            yield {"image": image[0], "mask": mask[0]}

    ragged = tf.data.Dataset.from_generator(varying, output_signature={
        "image": tf.TensorSpec((None, None, 3), tf.float32), "mask": tf.TensorSpec((None, None), tf.int32)})
    for name, dataset in (("fixed", fixed), ("varying", ragged)):
        config = TrainConfig.create("scratch", model=TINY.replace(patch_size=4), num_classes=2, image_size=28,
                                    steps=2, batch_size=8, workdir=str(tmp_path / name), progress=False,
                                    jit_compile=False, strategy="default", eval_batch_size=8, checkpoint_every=2,
                                    train_augment="inception_crop_flip")
        results = train(config, task=PixelTask(), dataset=dataset)
        assert results["eval"]["num_examples"] == 4 and results["plan"]["fields"]["mask"] == "mask", name
    with pytest.raises(UserError, match="without a .label.: give num_classes=N"):
        plan_lib.plan_run(config.replace(num_classes=None), PixelTask(), fixed)


def test_a_grid_model_trained_in_mixed_precision_is_kept_in_float32():
    import keras

    from keras_vit.tasks import ModelPlan

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = PixelTask().build_model(ModelPlan(TINY.replace(patch_size=4), (28, 28), 3))
    finally:
        keras.config.set_dtype_policy(previous)
    kept = PixelTask().export_model(model)
    assert {layer.dtype_policy.name for layer in kept.head.layers} == {"float32"}
    assert kept.vit.dtype_policy.name == "float32"
    reference = PixelTask().build_model(ModelPlan(TINY.replace(patch_size=4), (28, 28), 3))  # float32
    reference.set_weights(model.get_weights())
    images = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)
    np.testing.assert_allclose(kept(images), reference(images), atol=1e-5)  # the same weights, in float32


def test_a_task_of_the_old_build_model_form_is_built_with_one_line(capsys):
    from keras_vit.tasks import ModelPlan, build_task_model

    class OldForm(PixelTask):
        def build_model(self, model_config, image_size, num_classes, num_channels):
            return super().build_model(ModelPlan(model_config, image_size, num_classes, num_channels))

    model = build_task_model(OldForm(), ModelPlan(TINY.replace(patch_size=4), (28, 28), 3))
    assert model.vit.grid_size == (7, 7)
    assert "write build_model(self, plan)" in capsys.readouterr().err


def test_a_task_saved_model_is_validated_against_keras_and_other_formats_are_refused(tmp_path):
    from keras_vit.export import task_export
    from keras_vit.tasks import ModelPlan

    with pytest.raises(UserError, match="tflite: the pixel_classes task's model is not a classifier, and it exports "
                                        "as saved_model only"):
        task_export.export_task_run(tmp_path / "no-run", PixelTask(), "saved_model,tflite", tmp_path / "out")
    model = PixelTask().build_model(ModelPlan(TINY.replace(patch_size=4), (28, 28), 3))
    images = np.random.default_rng(0).uniform(0, 255, (3, 28, 28, 3)).astype(np.float32)
    task_export._write(model, PixelTask(), str(tmp_path / "served"))
    agreement = task_export._validate(model, PixelTask(), str(tmp_path / "served"), images)
    assert agreement["passed"] and agreement["outputs"] == ["mask", "probabilities"], agreement
    other = PixelTask().build_model(ModelPlan(TINY.replace(patch_size=4), (28, 28), 3))  # other weights
    disagreement = task_export._validate(other, PixelTask(), str(tmp_path / "served"), images)
    assert not disagreement["passed"]
    assert "serving_default probabilities: differs from Keras" in disagreement["problems"]


def test_a_task_gathering_across_replicas_runs_without_xla_and_does_not_accumulate():
    from tests.pixel_task import CentredTask

    config = TrainConfig.create("scratch", model=TINY, dataset="mnist5k", workdir="unused", batch_size=16)
    source = open_source(config)
    assert not plan_lib.resolve(config, source, num_replicas=2, jit_compile=True, task=CentredTask()).jit_compile
    assert plan_lib.resolve(config, source, num_replicas=1, jit_compile=True, task=CentredTask()).jit_compile
    with pytest.raises(UserError, match="reads every replica's examples, which a step accumulated over "
                                        "micro-batches cannot gather: give accum_steps=1"):
        plan_lib.resolve(config.replace(accum_steps=2), source, num_replicas=2, task=CentredTask())


def test_the_tasks_old_address_still_imports():
    import keras_vit.tasks
    from keras_vit.training import tasks as old_address

    assert old_address.Task is keras_vit.tasks.Task and old_address.TASKS is keras_vit.tasks.TASKS
