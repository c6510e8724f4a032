"""Examples with named fields (keras_vit.tasks.fields): a mask moves with every crop, flip,
affine, translation and geometric RandAugment op of its image, and a Task with a mask per
example (tests/pixel_task.py) trains from a list: with a mask column and resumes bitwise."""

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


def _train(mask_list, workdir, steps):
    command = [sys.executable, "-m", "keras_vit_cli", "train", "--task", "tests.pixel_task:PixelTask",
               "--dataset", f"list:{mask_list}", "--num-classes", "3", "--model", "Nano/4", "--image-size", "28",
               "--steps", str(steps), "--batch-size", "8", "--checkpoint-every", "2", "--workdir", str(workdir),
               "--recipe", "scratch", "--no-progress", "--no-jit", "--eval-batch-size", "8"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_mask_task_trains_and_resumes_bitwise_through_the_cli(mask_list, tmp_path):
    whole = _train(mask_list, tmp_path / "whole", 4)
    _train(mask_list, tmp_path / "halves", 2)
    _train(mask_list, tmp_path / "halves", 4)
    for a, b in zip(weights_of(tmp_path / "whole" / "model.keras"), weights_of(tmp_path / "halves" / "model.keras")):
        np.testing.assert_array_equal(a, b)
    import json

    results = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert results["plan"]["task"] == "tests.pixel_task:PixelTask"
    assert results["plan"]["fields"] == {"image": "image", "mask": "mask"}
    assert 0.0 <= results["eval"]["pixel_accuracy"] <= 1.0 and results["eval"]["num_examples"] == 3
    assert "pixel_accuracy" in whole.stdout


def test_the_tasks_old_address_still_imports():
    import keras_vit.tasks
    from keras_vit.training import tasks as old_address

    assert old_address.Task is keras_vit.tasks.Task and old_address.TASKS is keras_vit.tasks.TASKS
