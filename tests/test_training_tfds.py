"""Issue #13 item 3: tfds for real, offline. A tiny GeneratorBasedBuilder (real
PNG-encoded images, two splits) is prepared into a temp data dir; it trains end
to end through the CLI (tfds:DATA_DIR/NAME/VERSION), on one worker and on a
two-worker cluster, whose input pipelines read disjoint halves (even_splits)
covering the split. An unprepared dataset is an error that says how to prepare
it; nothing reaches the network."""

import json

import numpy as np
import pytest
import tensorflow as tf

from keras_vit.cli import main
from keras_vit.training import TrainConfig
from keras_vit.training import data as data_lib
from tests.training_helpers import plan_of
from tests.test_training_distributed import _finish, _free_ports, _launch

tfds = pytest.importorskip("tensorflow_datasets")

NUM_TRAIN, NUM_TEST = 40, 10


class TinyShades(tfds.core.GeneratorBasedBuilder):
    """Dark and light 16x16 noise pictures; each picture's top-left pixel is its index."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(16, 16, 3)),
            "label": tfds.features.ClassLabel(names=["dark", "light"])}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(NUM_TRAIN, 0), "test": self._generate_examples(NUM_TEST, 1)}

    def _generate_examples(self, n, seed):
        rng = np.random.default_rng(seed)
        for i in range(n):
            label = i % 2
            image = (rng.integers(0, 100, (16, 16, 3)) + 150 * label).astype(np.uint8)
            image[0, 0] = i
            yield i, {"image": image, "label": label}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    builder = TinyShades(data_dir=str(data_dir))
    builder.download_and_prepare()  # generates from _generate_examples: no download
    return data_dir, builder.data_dir


def _config(spec, **overrides):
    return TrainConfig.create("scratch", model="Nano/4", dataset=spec, progress=False, **overrides)


def test_a_prepared_directory_is_a_source_with_its_splits_and_names(prepared):
    data_dir, dataset_dir = prepared
    for spec, extra in ((f"tfds:{dataset_dir}", {}), ("tfds:tiny_shades", {"data_dir": str(data_dir)})):
        source = data_lib.open_source(_config(spec, **extra))
        assert source.class_names == ["dark", "light"] and source.num_classes == 2 and source.num_channels == 3
        assert source.sizes == {"train": NUM_TRAIN, "test": NUM_TEST} and source.eval_split == "test"
        assert source.image_size == (16, 16)


def test_two_input_pipelines_read_disjoint_halves_covering_the_split(prepared):
    source = data_lib.open_source(_config(f"tfds:{prepared[1]}"))
    assert source.shuffle_kind == "files"  # its record files, reordered each epoch
    seen = []
    for index in range(2):
        decoded = source.examples("train", index, 2).map(lambda *raw: source.decode(raw))
        seen.append([int(example["image"][0, 0, 0]) for example, _ in decoded.as_numpy_iterator()])
        assert len(seen[-1]) == source.shard_size("train", index, 2) == NUM_TRAIN // 2
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(NUM_TRAIN))
    # Through the training stream: one epoch of each worker's shard is that same half.
    config = _config(f"tfds:{prepared[1]}", batch_size=4, train_augment="none")
    for index in range(2):
        ds = data_lib.train_dataset(source, plan_of(source, (16, 16), 3, config, num_replicas=2),
                                    tf.distribute.InputContext(2, index, 2), 0)
        firsts = [int(round((v + 1) * 127.5)) for batch in ds.take(NUM_TRAIN // 2 // 2)
                  for v in batch["image"].numpy()[:, 0, 0, 0]]
        assert sorted(firsts) == sorted(seen[index])


@pytest.mark.slow
def test_trains_end_to_end_through_the_cli(prepared, tmp_path):
    workdir = tmp_path / "run"
    assert main(["train", "--dataset", f"tfds:{prepared[1]}", "--workdir", str(workdir), "--model", "Nano/4",
                 "--patch-size", "4", "--recipe", "scratch", "--steps", "3", "--batch-size", "8",
                 "--warmup-steps", "0", "--strategy", "default", "--no-jit", "--no-progress"]) == 0
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == 3 and results["eval"]["num_examples"] == NUM_TEST
    assert results["dataset"]["sizes"] == {"train": NUM_TRAIN, "test": NUM_TEST}


@pytest.mark.slow
def test_trains_on_a_two_worker_cluster(prepared, tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = [_launch({"workdir": str(tmp_path / "run"), "overrides": {
        "dataset": f"tfds:{prepared[1]}", "strategy": "multi_worker", "steps": 3, "batch_size": 8,
        "image_size": 28, "eval_batch_size": 8}},
        env={"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})})
        for index in range(2)]
    results = [_finish(w) for w in workers]
    assert [r["replicas"] for r in results] == [2, 2]
    assert results[0]["losses"] == results[1]["losses"] and len(results[0]["losses"]) == 3
    assert results[0]["eval"]["num_examples"] == NUM_TEST  # each worker its half, summed


def test_an_unprepared_dataset_says_how_to_prepare_it(tmp_path):
    for spec in ("tfds:tiny_shades", "tfds:mnist"):
        with pytest.raises(ValueError, match=r"is not prepared in .*download_and_prepare\(\).*data_dir='DATA_DIR'"):
            data_lib.open_source(_config(spec, data_dir=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="not a prepared tfds dataset directory"):
        data_lib.open_source(_config(f"tfds:{tmp_path}"))
