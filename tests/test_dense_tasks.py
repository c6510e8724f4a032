"""Segmentation and depth (#56): the heads (keras_vit.layers.dense_heads), the Tasks' losses and
standard metrics against hand computations, masks:/depth: folders as people lay them out (and
their mistakes), and whole runs through the CLI from DINOv3 and DINOv2 checkpoints saved by
transformers: train, resume bitwise, evaluate, predict at each image's size, export SavedModel
and TFLite."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit.errors import UserError
from keras_vit.layers.dense_heads import DPTHead, LinearHead, dpt_blocks
from keras_vit.tasks.depth import DepthTask
from keras_vit.tasks.fields import IGNORE
from keras_vit.tasks.segmentation import SegmentationTask

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, patch_size=4,
             image_size=32)


# --- the heads ---------------------------------------------------------------------------

def test_the_linear_head_is_a_linear_map_then_a_bilinear_resize():
    grid = np.random.default_rng(0).normal(size=(2, 5, 7, 12)).astype(np.float32)
    head = LinearHead(3, 4)
    head.build(grid.shape)
    kernel, bias = (np.asarray(w) for w in head.weights)
    want = tf.image.resize(grid @ kernel + bias, (20, 28), method="bilinear").numpy()
    np.testing.assert_allclose(head([grid]).numpy(), want, atol=1e-5)
    assert dpt_blocks(12) == (2, 5, 8, 11) and dpt_blocks(24) == (5, 11, 17, 23) and dpt_blocks(4) == (0, 1, 2, 3)


def test_the_dpt_head_gives_every_pixel_and_round_trips():
    rng = np.random.default_rng(1)
    grids = [rng.normal(size=(2, 5, 7, 12)).astype(np.float32) for _ in range(4)]  # odd sides: 1/2x rounds up
    head = DPTHead(3, 16, features=8)
    head.build([g.shape for g in grids])
    out = head(grids).numpy()
    assert out.shape == (2, 80, 112, 3) and np.isfinite(out).all()
    again = DPTHead.from_config(head.get_config())
    again.build([g.shape for g in grids])
    again.set_weights(head.get_weights())
    np.testing.assert_allclose(again(grids).numpy(), out, atol=1e-5)
    # Every grid reaches the output: the deepest through three fusions, the shallowest through one.
    for i in range(4):
        moved = list(grids)
        moved[i] = moved[i] + 1.0
        assert np.abs(head(moved).numpy() - out).max() > 1e-4


@pytest.mark.parametrize("kind", ["linear", "dpt"])
def test_a_head_answers_on_any_grid_in_a_graph_of_unknown_sizes(kind):
    """What an export for any size runs: the head traced once with no sizes known, then given
    grids of other sizes (odd and even sides), equals the same weights built for each size."""
    rng = np.random.default_rng(2)
    make = (lambda: LinearHead(3, 4)) if kind == "linear" else (lambda: DPTHead(3, 4, features=8))
    head = make()
    head.build([(None, 4, 4, 12)] * 4)
    for w in head.weights:
        w.assign(rng.normal(scale=0.3, size=w.shape))
    traced = tf.function(head, input_signature=[[tf.TensorSpec((None, None, None, 12))] * 4])
    for rows, cols in ((3, 5), (6, 4)):
        grids = [rng.normal(size=(2, rows, cols, 12)).astype(np.float32) for _ in range(4)]
        fixed = make()
        fixed.build([g.shape for g in grids])
        fixed.set_weights(head.get_weights())
        want = fixed(grids).numpy()
        assert want.shape == (2, rows * 4, cols * 4, 3)
        np.testing.assert_allclose(traced(grids).numpy(), want, atol=1e-5)


# --- losses and metrics ------------------------------------------------------------------

class _Fixed:
    """A model that returns the outputs it was given, whatever the images."""

    def __init__(self, outputs):
        self.outputs = tf.constant(outputs, tf.float32)

    def __call__(self, images, training=False):
        return self.outputs


def test_segmentation_metrics_are_one_confusion_matrix_over_the_set():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 6, 5, 4)).astype(np.float32)
    truth = rng.integers(0, 3, size=(3, 6, 5)).astype(np.int32)  # class 3 is never true...
    logits[..., 3] -= 100.0  # ...nor predicted: left out of the mean
    truth[0, :2] = IGNORE
    weight = np.array([1.0, 1.0, 0.0], np.float32)  # the third example is padding
    task = SegmentationTask()
    batch = {"image": tf.zeros((3, 6, 5, 3)), "mask": tf.constant(truth), "weight": tf.constant(weight)}
    sums = {k: float(v) for k, v in task.weighted_sums(_Fixed(logits), batch).items()}
    figures = task.summarize(sums)
    predicted, known = logits.argmax(-1)[:2], truth[:2] != IGNORE
    ious = []
    for k in range(3):
        p, t = (predicted == k) & known, (truth[:2] == k) & known
        ious.append((p & t).sum() / (p | t).sum())
    assert figures["num_examples"] == 2 and "iou_3" not in figures
    np.testing.assert_allclose([figures[f"iou_{k}"] for k in range(3)], ious, rtol=1e-6)
    np.testing.assert_allclose(figures["mean_iou"], np.mean(ious), rtol=1e-6)
    np.testing.assert_allclose(figures["pixel_accuracy"], (predicted == truth[:2])[known].mean(), rtol=1e-6)
    lines = task.describe_classes(figures, ["sky", "tree", "road", "car"])
    assert [line.split()[0] for line in lines] == ["sky", "tree", "road"]


def test_depth_loss_and_metrics_against_their_formulas():
    rng = np.random.default_rng(3)
    log_depth = rng.normal(0.5, 0.3, size=(2, 4, 4, 1)).astype(np.float32)
    truth = rng.uniform(0.5, 4.0, size=(2, 4, 4)).astype(np.float32)
    truth[0, 0] = 0.0  # unknown pixels
    batch = {"image": tf.zeros((2, 4, 4, 3)), "depth": tf.constant(truth), "weight": tf.ones(2)}
    predicted, known = np.exp(log_depth[..., 0]), truth > 0
    loss, _ = DepthTask(loss="silog").compute_loss(_Fixed(log_depth), batch, False)
    for i in range(2):
        g = np.log(predicted[i][known[i]]) - np.log(truth[i][known[i]])
        np.testing.assert_allclose(loss[i], np.sqrt(np.mean(g ** 2) - 0.85 * np.mean(g) ** 2), rtol=1e-4)
    l1, _ = DepthTask(loss="l1").compute_loss(_Fixed(log_depth), batch, False)
    np.testing.assert_allclose(l1[1], np.abs(predicted[1] - truth[1]).mean(), rtol=1e-5)
    task = DepthTask()
    figures = task.summarize({k: float(v) for k, v in task.weighted_sums(_Fixed(log_depth), batch).items()})
    p, t = predicted[known], truth[known]
    np.testing.assert_allclose(figures["abs_rel"], np.mean(np.abs(p - t) / t), rtol=1e-5)
    np.testing.assert_allclose(figures["rmse"], np.sqrt(np.mean((p - t) ** 2)), rtol=1e-5)
    np.testing.assert_allclose(figures["delta1"], np.mean(np.maximum(p / t, t / p) < 1.25), rtol=1e-6)
    with pytest.raises(UserError, match="--depth-loss l2: choose one of silog, l1"):
        DepthTask(loss="l2")


# --- data ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """keras-vit scenes' folder: 20 scenes of 40 px, 4 of them in val/."""
    from keras_vit.data.scenes import write_scenes

    folder = tmp_path_factory.mktemp("scenes") / "scenes"
    write_scenes(str(folder), 20, 40, seed=0, val_share=0.2)
    return folder


def _source(spec, task, **settings):
    from keras_vit.training import TrainConfig
    from keras_vit.training.sources import open_source

    config = TrainConfig.create("finetune", dataset=spec, workdir="unused", **settings)
    return open_source(config, fields=task.fields)


def _examples(source, split="eval"):
    """[(example, ok)] of a split, decoded one by one as the pipeline does."""
    out = []
    for raw in source.examples(split, 0, 1):
        example, ok = source.decode(raw)
        out.append(({k: np.asarray(v) for k, v in example.items()}, bool(ok)))
    return out


def test_scenes_agree_with_their_masks_and_depth(scenes):
    from keras_vit.data.scenes import CLASSES

    assert (scenes / "classes.txt").read_text().split() == list(CLASSES)
    assert len(os.listdir(scenes / "train" / "images")) == 16 and len(os.listdir(scenes / "val" / "depth")) == 4
    mask = np.asarray(Image.open(scenes / "train" / "masks" / "scene_00004.png"))
    depth = np.asarray(Image.open(scenes / "train" / "depth" / "scene_00004.png")).astype(np.float64) / 1000
    assert ((mask == IGNORE) == (depth == 0)).all()  # the sky: no class, no depth
    assert 1.4 < depth[depth > 0].min() and depth.max() < 12.1
    assert len(set(np.unique(mask)) - {IGNORE}) >= 2


def test_masks_and_depth_folders_in_each_layout(scenes, tmp_path, capsys):
    source = _source(f"masks:{scenes}", SegmentationTask())
    assert source.num_classes == 5 and source.sizes == {"train": 16, "eval": 4}
    assert source.class_names[1] == "disc"
    depth = _source(f"depth:{scenes}", DepthTask())
    assert depth.sizes == {"train": 16, "eval": 4}
    # A flat folder: images/ and masks/, every 10th pair held out; a missing mask named and left out.
    flat = tmp_path / "flat"
    for sub in ("images", "masks"):
        (flat / sub).mkdir(parents=True)
    for i in range(12):
        Image.fromarray(np.full((8, 8, 3), 20 * i, np.uint8)).save(flat / "images" / f"{i}.jpg")
        if i != 5:
            Image.fromarray(np.full((8, 8), i % 2, np.uint8), mode="L").save(flat / "masks" / f"{i}.png")
    flat_source = _source(f"masks:{flat}", SegmentationTask(), num_classes=2)
    assert flat_source.sizes == {"train": 10, "eval": 1}
    assert "1 image(s) in" in capsys.readouterr().err and "5.jpg" not in str(flat_source.sizes)
    with pytest.raises(UserError, match="has no classes.txt, so the classes are not known: give --num-classes"):
        _source(f"masks:{flat}", SegmentationTask())
    with pytest.raises(UserError, match=r"has no depth/ folder"):
        _source(f"depth:{flat}", DepthTask())
    with pytest.raises(UserError, match="contradicts masks:.*classes.txt, which names 5"):
        _source(f"masks:{scenes}", SegmentationTask(), num_classes=3)


def test_a_masks_folder_on_another_filesystem_reads_as_a_local_one(scenes):
    """masks:ram://... (TensorFlow's in-memory filesystem standing in for gs://): listed, split, its
    classes.txt read and its pairs decoded through keras_vit.utils.storage, as the local folder."""
    import uuid

    from keras_vit.utils import storage

    root = f"ram://scenes-{uuid.uuid4().hex}"
    for path in sorted(scenes.rglob("*")):
        if path.is_file():
            storage.write_bytes(f"{root}/{path.relative_to(scenes).as_posix()}", path.read_bytes())
    remote, local = (_source(f"masks:{where}", SegmentationTask()) for where in (root, scenes))
    assert remote.sizes == local.sizes and remote.class_names == local.class_names
    for (a, ok_a), (b, ok_b) in zip(_examples(remote), _examples(local)):
        assert ok_a and ok_b
        np.testing.assert_array_equal(a["mask"], b["mask"])
        np.testing.assert_array_equal(a["image"], b["image"])


def _records(path, rows):
    """A tfrecord file of tf.train.Examples, each {feature name: bytes}."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in rows:
            feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v])) for k, v in row.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_tfrecords_of_masks_and_depth_read_as_the_folders_do(scenes, tmp_path, capsys):
    """tfrecord:DIR for the per-pixel tasks: masks under DeepLab's feature names (as its
    build_voc2012_data.py writes them), depth maps under ours, each record decoded as the
    masks:/depth: folder's files; a record without its map named by its image's digest."""
    def read(split, kind):
        folder = scenes / split
        return [((folder / "images" / f.name).read_bytes(), f.read_bytes())
                for f in sorted((folder / kind).iterdir())]

    (tmp_path / "seg").mkdir()
    (tmp_path / "seg" / "classes.txt").write_text((scenes / "classes.txt").read_text())
    for split, out in (("train", "train-00000-of-00001.tfrecord"), ("val", "val-00000-of-00001.tfrecord")):
        _records(tmp_path / "seg" / out, [{"image/encoded": i, "image/format": b"png", "image/segmentation/class/encoded": m,
                                           "image/segmentation/class/format": b"png"} for i, m in read(split, "masks")])
    (tmp_path / "depth").mkdir()
    depth_rows = [{"image": i, "depth": m} for i, m in read("val", "depth")]
    _records(tmp_path / "depth" / "train.tfrecord", [{"image": i, "depth": m} for i, m in read("train", "depth")])
    _records(tmp_path / "depth" / "val.tfrecord", depth_rows + [{"image": depth_rows[0]["image"]}])
    for kind, spec, task, field in (("masks", tmp_path / "seg", SegmentationTask(), "mask"),
                                    ("depth", tmp_path / "depth", DepthTask(), "depth")):
        records, folder = _source(f"tfrecord:{spec}", task), _source(f"{kind}:{scenes}", task)
        assert records.num_classes == folder.num_classes and records.class_names == folder.class_names
        got, want = _examples(records), _examples(folder)
        assert [ok for _, ok in got] == [True] * len(want) + ([False] if kind == "depth" else [])
        for (a, _), (b, _) in zip(got, want):
            np.testing.assert_array_equal(a["image"], b["image"])
            np.testing.assert_array_equal(a[field], b[field])
    err = capsys.readouterr().err
    assert "the depth of the record of tfrecord:" in err and "whose image's SHA-1 begins" in err and "is empty" in err


def test_dirty_pairs_are_named_once_and_skipped(tmp_path, capsys):
    folder = tmp_path / "dirty"
    for sub in ("images", "masks", "depth"):
        (folder / sub).mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((8, 10, 3), 40 * i, np.uint8)).save(folder / "images" / f"{i}.png")
        Image.fromarray(np.full((8, 10), 1, np.uint8), mode="L").save(folder / "masks" / f"{i}.png")
        Image.fromarray(np.full((8, 10), 2500, np.uint16)).save(folder / "depth" / f"{i}.png")
    Image.fromarray(np.ones((10, 10), np.uint8), mode="L").save(folder / "masks" / "1.png")  # another size
    Image.fromarray(np.full((8, 10), 7, np.uint8), mode="L").save(folder / "masks" / "2.png")  # class 7 of 3
    Image.fromarray(np.zeros((8, 10), np.uint16)).save(folder / "depth" / "3.png")  # no known depth
    spec = f"{folder},{folder}"
    masks = _examples(_source(f"masks:{spec}", SegmentationTask(), num_classes=3))
    assert [ok for _, ok in masks] == [True, False, False, True]
    err = capsys.readouterr().err
    assert "1.png is 10x10 px and its image 10x8 (read upright" in err
    assert "holds class 7, and the run has 3 classes" in err
    depth = _examples(_source(f"depth:{spec}", DepthTask()))
    assert [ok for _, ok in depth] == [True, True, True, False]
    np.testing.assert_allclose(depth[0][0]["depth"], 2.5)  # a PNG's millimetres in metres
    assert "3.png has no pixel of known depth" in capsys.readouterr().err


# --- whole runs ----------------------------------------------------------------------------

def _cli(*args, ok=True):
    done = subprocess.run([sys.executable, "-m", "keras_vit_cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": ROOT})
    assert (done.returncode == 0) == ok, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A DINOv3 and a DINOv2 of 4 blocks, perturbed and saved by transformers."""
    import transformers

    from tests.sources_helpers import perturb_torch

    root = tmp_path_factory.mktemp("dense_checkpoints")
    for name, model in (("dinov3", transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
                            **SMALL, num_register_tokens=2, layerscale_value=0.5))),
                        ("dinov2", transformers.Dinov2Model(transformers.Dinov2Config(**SMALL)))):
        perturb_torch(model.eval(), 0, scale=0.2)
        model.save_pretrained(root / name)
    return root


def _train(task, head, weights, data, workdir, steps, *extra):
    return _cli("train", "--task", task, "--head", head, "--weights", weights, "--dataset", data,
                "--image-size", "32", "--steps", steps, "--batch-size", "4", "--checkpoint-every", "2",
                "--warmup-steps", "0", "--learning-rate", "1e-3", "--workdir", workdir, "--no-progress", "--no-jit",
                "--eval-batch-size", "4", *extra)


@pytest.mark.slow
def test_a_dinov3_segmentation_run_evaluates_predicts_and_exports(checkpoints, scenes, tmp_path):
    # Its kill -9 and bitwise resume: tests/test_training_distributed.py (KILL_9["segmentation"]).
    _train("segmentation", "linear", checkpoints / "dinov3", f"masks:{scenes}", tmp_path / "run", 2)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plan"]["task"] == "segmentation" and 0 <= results["eval"]["mean_iou"] <= 1
    shown = _cli("evaluate", tmp_path / "run", f"masks:{scenes}", "--json")
    figures = json.loads(shown.stdout)
    assert figures["num_examples"] == 4 and figures["mean_iou"] == pytest.approx(results["eval"]["mean_iou"])
    lines = _cli("evaluate", tmp_path / "run", f"masks:{scenes}").stdout
    assert "mIoU" in lines and "ground" in lines  # per class, by classes.txt's names
    # predict --out: the mask at the image's own size (not the model's 32 px), a colour for the eye.
    photo = tmp_path / "wide.png"
    Image.fromarray(np.asarray(Image.open(scenes / "val" / "images" / "scene_00000.png")).repeat(2, axis=1)).save(photo)
    _cli("predict", tmp_path / "run", photo, "--out", tmp_path / "out")
    mask = np.asarray(Image.open(tmp_path / "out" / "wide_mask.png"))
    assert mask.shape == (40, 80) and mask.max() < 5
    assert np.asarray(Image.open(tmp_path / "out" / "wide_colour.png")).shape == (40, 80, 3)
    shown = _cli("inspect", tmp_path / "run", "--images", scenes / "val" / "images", "--out", tmp_path / "figures")
    assert "outputs" in shown.stdout and Image.open(tmp_path / "figures" / "outputs.png").size[0] > 300
    _cli("export", tmp_path / "run", "--formats", "saved_model,tflite", "--out", tmp_path / "exports")
    report = json.loads((tmp_path / "exports" / "report.json").read_text())
    assert report["passed"] and [a["format"] for a in report["artifacts"]] == ["saved_model", "tflite"]
    assert report["any_size"]  # DINOv3's rotary positions: each image read at its own aspect ratio
    assert report["artifacts"][1]["other_size"] == "40x36"  # the TFLite file checked at another grid too
    # Served in a fresh process as TF Serving would: the mask at the image's size, padded in a batch of two,
    # the same mask as predict's (both read the 2:1 image on a 2:1 grid); serving_default at another size.
    served = subprocess.run([sys.executable, "-c", _SERVE, str(tmp_path / "exports" / "run" / "1"), str(photo),
                             str(scenes / "val" / "images" / "scene_00000.png")], capture_output=True, text=True,
                            timeout=300)
    assert served.returncode == 0, served.stderr[-2000:]
    sizes, first, second, other = json.loads(served.stdout.splitlines()[-1])
    assert sizes == [[40, 80], [40, 40]] and first == mask.tolist()[0][:8] and second == IGNORE
    assert other == [1, 48, 24]


_SERVE = r'''
import json, sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
images = [open(p, "rb").read() for p in sys.argv[2:]]
out = loaded.signatures["serving_bytes"](image_bytes=tf.constant(images))
mask = out["mask"].numpy()
other = loaded.signatures["serving_default"](images=tf.zeros((1, 48, 24, 3)))["mask"].shape.as_list()
print(json.dumps([out["image_size"].numpy().tolist(), mask[0, 0, :8].tolist(), int(mask[1, 0, 60]), other]))
'''


@pytest.mark.slow
def test_a_dinov2_depth_run_with_a_dpt_head_trains_evaluates_and_exports(checkpoints, scenes, tmp_path):
    _train("depth", "dpt", checkpoints / "dinov2", f"depth:{scenes}", tmp_path / "run", 2, "--depth-loss", "l1")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plan"]["task"] == "depth" and results["eval"]["rmse"] > 0
    figures = json.loads(_cli("evaluate", tmp_path / "run", f"depth:{scenes}", "--json").stdout)
    assert figures["abs_rel"] == pytest.approx(results["eval"]["abs_rel"], rel=1e-5)
    assert figures["loss"] == pytest.approx(results["eval"]["loss"], rel=1e-5)  # the run's L1, read back
    _cli("predict", tmp_path / "run", scenes / "val" / "images" / "scene_00001.png", "--out", tmp_path / "out")
    depth = np.asarray(Image.open(tmp_path / "out" / "scene_00001_depth.png"))
    assert depth.shape == (40, 40) and depth.dtype == np.uint16 and depth.min() >= 1
    # Learned positions, interpolated in the graph: any size where asked.
    _cli("export", tmp_path / "run", "--formats", "saved_model,tflite", "--out", tmp_path / "exports",
         "--dynamic-image-size")
    report = json.loads((tmp_path / "exports" / "report.json").read_text())
    assert report["passed"] and report["any_size"] and report["artifacts"][0]["other_size"] == "49x35"


@pytest.mark.slow
def test_a_frozen_backbone_trains_the_head_alone(checkpoints, scenes, tmp_path):
    done = _train("segmentation", "linear", checkpoints / "dinov3", f"masks:{scenes}", tmp_path / "run", 1,
                  "--freeze-backbone")
    assert "(165 of " in done.stdout  # the linear head alone: 32 x 5 + 5
    from keras_vit import runs
    from keras_vit.weights.layout import variables_by_key

    import keras_vit

    trained = runs.load_model(str(tmp_path / "run")).vit
    base = keras_vit.from_pretrained(str(checkpoints / "dinov3"))
    for key, variable in variables_by_key(base).items():
        if not key.startswith("head"):
            np.testing.assert_array_equal(np.asarray(variable), np.asarray(variables_by_key(trained)[key]), key)
    refused = _cli("train", "--task", "segmentation", "--dataset", f"masks:{scenes}", "--freeze-backbone",
                   "--lora-rank", "4", "--weights", checkpoints / "dinov3", "--workdir", tmp_path / "r2", ok=False)
    assert "--freeze-backbone trains the head alone, and --lora-rank adapts the backbone" in refused.stderr


def test_predict_out_is_for_per_pixel_runs(tmp_path, capsys):
    import keras_vit
    from keras_vit.cli import main

    keras_vit.ViT("Nano/4", image_size=16, num_classes=2).save(tmp_path / "classifier.keras")
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "classifier.keras"), str(tmp_path / "x.png"), "--out",
                 str(tmp_path / "out")]) == 2
    assert "--out writes the per-pixel outputs of a segmentation or depth run" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_cli_writes_scenes_and_refuses_a_full_folder(tmp_path):
    from keras_vit.cli import main

    assert main(["scenes", str(tmp_path / "s"), "--count", "3", "--size", "24"]) == 0
    assert len(os.listdir(tmp_path / "s" / "train" / "images")) == 2
    assert main(["scenes", str(tmp_path / "s"), "--count", "3"]) == 2


def test_lora_adapts_the_backbone_and_the_dpt_head_trains_whole():
    from keras_vit.tasks import ModelPlan
    from keras_vit.training.optimization import layer_scales
    from keras_vit.variants import get_variant
    from keras_vit.weights.layout import is_lora_key, variables_by_key

    config = get_variant("Mu/4").replace(lora_rank=2)
    model = SegmentationTask(head="dpt").build_model(ModelPlan(config, (16, 16), 3, 3))
    trainable = {v.path for v in model.trainable_variables}
    vit = variables_by_key(model.vit)
    assert {v.path for k, v in vit.items() if is_lora_key(k)} <= trainable
    assert not {v.path for k, v in vit.items() if not is_lora_key(k)} & trainable
    assert {v.path for v in model.head.weights} <= trainable
    assert model.blocks == (0, 1, 2, 3) and model(np.zeros((1, 16, 16, 3), np.float32)).shape == (1, 16, 16, 3)
    scales = layer_scales(model, 0.5)  # the head at the recipe's rate, the blocks below it decayed
    assert all(scales[v.path] == 1.0 for v in model.head.weights)
    assert scales[vit["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/lora_a"].path] == 0.5 ** 4
    rng = np.random.default_rng(0)
    for key, variable in vit.items():  # B starts at zero: give merging something to carry
        if key.endswith("lora_b"):
            variable.assign(rng.normal(scale=0.3, size=variable.shape).astype(np.float32))
    plain = model.exported()
    assert not plain.vit.config.lora_rank and plain.blocks == model.blocks
    x = rng.normal(size=(2, 16, 16, 3)).astype(np.float32)
    np.testing.assert_allclose(plain(x).numpy(), model(x).numpy(), atol=1e-4)
    unmerged = SegmentationTask(head="dpt").build_model(ModelPlan(get_variant("Mu/4"), (16, 16), 3, 3))
    unmerged.set_weights([w for w, v in zip(model.get_weights(), model.weights) if "lora" not in v.path])
    assert np.abs(unmerged(x).numpy() - model(x).numpy()).max() > 1e-3  # the updates count


def test_the_per_pixel_flags_are_refused_where_no_task_reads_them():
    from keras_vit.tasks import make_task
    from keras_vit.training import TrainConfig

    config = TrainConfig.create("finetune", model="Mu/4", workdir="w")
    with pytest.raises(UserError, match="head is for --task segmentation or depth; freeze_backbone is for "
                                        "--task segmentation or depth, and this run's task is classification"):
        make_task(config.replace(head="dpt", freeze_backbone=True))
    with pytest.raises(UserError, match="depth_loss is for --task depth, and this run's task is segmentation"):
        make_task(config.replace(task="segmentation", depth_loss="l1"))
    task = make_task(config.replace(task="depth", head="dpt", depth_loss="l1", freeze_backbone=True))
    assert (task.head, task.loss, task.freeze_backbone) == ("dpt", "l1", True)
