"""Every recipe on every kind of data, as users run them (#29).

Each name in RECIPES trains a few steps of a small ViT on: a folder of RGB
JPEGs of mixed sizes (real photos), a folder of greyscale PNGs, the bundled
digits and a `list:` file through the command line; numpy arrays and a
tf.data.Dataset of images of varying sizes through the API. A recipe or a
data source added to the tables below gets its row without further work.
The batch (10) is a multiple of neither DeiT's mixing group (6) nor 4: any
batch a user chooses must train.
"""

import argparse
import csv
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit import ViTConfig
from keras_vit.cli import main
from keras_vit.tasks import RECIPE_TASKS
from keras_vit.training import RECIPES, TrainConfig, train
from keras_vit.training import cli as train_cli

STEPS, BATCH = 2, 10
# 8-pixel patches at 32 px: a 4x4 grid, a fraction of a second a step.
FLAGS = ["--patch-size", "8", "--image-size", "32", "--steps", str(STEPS), "--batch-size",
         str(BATCH), "--eval-batch-size", "100", "--no-jit", "--strategy", "default", "--no-progress",
         "--checkpoint-every", "1000"]


def _photos():
    """scikit-learn's two sample photos (china.jpg, flower.jpg), 427x640 RGB."""
    from sklearn.datasets import load_sample_images

    return load_sample_images().images


def _crops(photo, count, seed):
    """`count` crops of mixed sizes and aspect ratios of a photo."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        h, w = int(rng.integers(24, 120)), int(rng.integers(24, 160))
        top, left = int(rng.integers(0, photo.shape[0] - h)), int(rng.integers(0, photo.shape[1] - w))
        yield photo[top:top + h, left:left + w]


class _Retracing(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        if "triggered tf.function retracing" in record.getMessage():
            self.messages.append(record.getMessage())


@pytest.fixture(scope="module", autouse=True)
def no_retracing_warning():
    """The matrix's dozens of runs in one process each trace their own steps once: TensorFlow
    must not call that retracing (it said so from the sixth run on: keras_vit.training.steps._compiled)."""
    seen = _Retracing()
    logging.getLogger("tensorflow").addHandler(seen)
    yield
    logging.getLogger("tensorflow").removeHandler(seen)
    assert not seen.messages, seen.messages[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    rows = []
    for c, photo in enumerate(_photos()):
        for i, crop in enumerate(_crops(photo, 12, c)):
            path = root / "jpegs" / f"class{c}" / f"{i}.jpg"
            os.makedirs(path.parent, exist_ok=True)
            Image.fromarray(crop).save(path, quality=90)
            rows.append((os.path.relpath(path, root), c))
            grey = root / "greys" / f"class{c}" / f"{i}.png"
            os.makedirs(grey.parent, exist_ok=True)
            Image.fromarray(crop).convert("L").save(grey)
    with open(root / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows([("path", "label")] + rows)
    return root


CLI_SOURCES = {
    "rgb_jpegs": lambda root: f"folder:{root / 'jpegs'}",
    "grey_pngs": lambda root: f"folder:{root / 'greys'}",
    "mnist5k": lambda root: "mnist5k",
    "list": lambda root: f"list:{root / 'list.csv'}",
}


def _arrays():
    rng = np.random.default_rng(0)
    images = np.stack([crop[:24, :24] for photo in _photos() for crop in _crops(photo, 15, 7)
                       if crop.shape[0] >= 24 and crop.shape[1] >= 24][:24])
    return images, rng.integers(0, 3, len(images)).astype(np.int64)


def _varying_dataset():
    crops = [crop for c, photo in enumerate(_photos()) for crop in _crops(photo, 12, 10 + c)]
    labels = [i % 2 for i in range(len(crops))]
    return tf.data.Dataset.from_generator(
        lambda: iter(zip(crops, labels)),
        output_signature=(tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([], tf.int64)))


API_SOURCES = {"arrays": _arrays, "varying_dataset": _varying_dataset}
# The recipes of labelled images. siglip and clip train an image and its caption (their Task's
# fields: image, text), which none of these sources has: they refuse them in one line (tests
# below), and train on every form of captions: in tests/test_image_text_training.py.
LABELLED_RECIPES = sorted(name for name in RECIPES if name not in RECIPE_TASKS or RECIPE_TASKS[name] != "image_text")
# One block of width 32: the matrix's many runs spend their time tracing, which grows with depth.
SMALL = ViTConfig(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1)


@pytest.mark.parametrize("recipe", LABELLED_RECIPES)
@pytest.mark.slow
def test_every_recipe_trains_on_a_folder_of_photos_through_the_cli(recipe, data, tmp_path):
    """The command a user pastes, whole: `keras-vit train --recipe R --dataset folder:...`."""
    workdir = tmp_path / "run"
    code = main(["train", "--recipe", recipe, "--dataset", CLI_SOURCES["rgb_jpegs"](data), "--workdir",
                 str(workdir), "--model", "Nano/4", *FLAGS])
    assert code == 0
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == STEPS and np.isfinite(results["train"]["loss"])
    _check_plan(json.loads((workdir / "config.json").read_text())["plan"], RECIPES[recipe])


def _cli_config(recipe, dataset, workdir):
    """The TrainConfig the command line makes of these flags, on the SMALL model."""
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--recipe", recipe, "--dataset", dataset, "--workdir", str(workdir), *FLAGS])
    return train_cli.check_args(args).replace(model=SMALL, patch_size=None)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", LABELLED_RECIPES)
@pytest.mark.parametrize("source", sorted(set(CLI_SOURCES) - {"rgb_jpegs"}) + sorted(API_SOURCES))
def test_every_recipe_trains_on_every_kind_of_data(recipe, source, data, tmp_path):
    """Files through the command line's flags; arrays and datasets through the API
    (the folder of photos: the command line test above, whole)."""
    if source in CLI_SOURCES:
        results = train(_cli_config(recipe, CLI_SOURCES[source](data), tmp_path / "run"))
    else:
        config = TrainConfig.create(recipe, model=SMALL, image_size=32, steps=STEPS, batch_size=BATCH,
                                    eval_batch_size=100, jit_compile=False, strategy="default", progress=False,
                                    workdir=str(tmp_path / "run"))
        results = train(config, dataset=API_SOURCES[source]())
    assert results["steps"] == STEPS and np.isfinite(results["train"]["loss"])
    _check_plan(results["plan"], RECIPES[recipe])


@pytest.mark.parametrize("recipe", ["siglip", "clip"])
def test_image_text_recipes_refuse_labelled_images_in_one_line(recipe, data, tmp_path, capsys):
    code = main(["train", "--recipe", recipe, "--dataset", CLI_SOURCES["rgb_jpegs"](data), "--workdir",
                 str(tmp_path / "run"), "--model", "Nano/4", *FLAGS])
    err = capsys.readouterr().err
    assert code == 2 and "captions:FILE" in err and "Traceback" not in err


def _check_plan(plan, recipe):
    """What trained is what the recipe asks for: its ops, in order, and its mixing.
    (An AugReg level always brings RandAugment; by size, a model as narrow as
    these gets light1, which has no Mixup.)"""
    ops = [op["op"] for op in plan["augmentation"]]
    assert ops[0] in ("inception_crop", "resize") and "to_model_range" in ops
    assert ("randaugment" in ops) == (bool(recipe.randaugment and recipe.randaugment[0])
                                      or recipe.aug_level is not None)
    assert ("random_erasing" in ops) == bool(recipe.random_erasing)
    assert (ops[-1] == "mix") == recipe.mixes
    assert plan["steps"] == STEPS and plan["global_batch"] == BATCH


@pytest.mark.parametrize("recipe", LABELLED_RECIPES)
def test_each_recipe_default_batch_passes_the_checks_and_makes_a_batch(recipe):
    """The recipe's own batch, on 1 and on 8 replicas (DeiT's 1024 = 8 x 128:
    refused before, as no power of two holds whole groups of 6)."""
    from keras_vit.training import data as data_lib
    from keras_vit.training import plan as plan_lib
    config = TrainConfig(recipe=recipe, model="Mu/4", dataset="mnist5k").replace(image_size=8, patch_size=4)
    source = data_lib.open_source(config)
    for replicas in (1, 8):
        plan = plan_lib.resolve(config, source, num_replicas=replicas)
        assert plan.per_replica_batch * replicas == RECIPES[recipe].batch_size
    batch = next(iter(data_lib.train_dataset(source, plan, tf.distribute.InputContext(1, 0, 8), 0)))
    assert batch["image"].shape == (plan.per_replica_batch, 8, 8, 1)
