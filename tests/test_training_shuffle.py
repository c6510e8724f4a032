"""Issue #21 item 1: the training stream at the size where shuffling breaks.

Class-sorted sources larger than the shuffle buffer: the first batches are a
sample of every class, an epoch visits each example once, resuming mid-epoch
continues the same stream, and two workers' shards are disjoint and cover
the data. Examples carry their index in their pixels, so the stream can be
read back exactly."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from keras_vit.training import TrainConfig
from keras_vit.training import data as data_lib
from keras_vit.training import stream as stream_lib
from tests.training_helpers import plan_of

CLASSES = 30
PER_CLASS = 100  # 3,000 examples, six times the buffer below
BUFFER = 500


def _indexed_arrays(n, classes):
    """Class-sorted examples whose 2x2 pixels spell their index (base 256)."""
    ids = np.arange(n)
    images = np.zeros((n, 2, 2, 1), np.uint8)
    images[:, 0, 0, 0] = ids % 256
    images[:, 0, 1, 0] = ids // 256
    return images, (ids * classes // n).astype(np.int32)


def _ids(batch):
    pixels = np.rint((batch["image"].numpy() + 1.0) * 127.5).astype(np.int64)
    return pixels[:, 0, 0, 0] + 256 * pixels[:, 0, 1, 0]


def _config(**overrides):
    settings = dict(model="Nano/4", dataset="mnist5k", shuffle_buffer=BUFFER, batch_size=50, train_augment="none",
                    progress=False)
    settings.update(overrides)
    return TrainConfig.create("scratch", **settings)


def _stream(source, config, examples_seen=0, pipeline=0, pipelines=1, batches=10):
    context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline,
                                         num_replicas_in_sync=pipelines)
    ds = data_lib.train_dataset(source, plan_of(source, (2, 2), 1, config), context, examples_seen)
    return [(_ids(b), b["label"].numpy()) for b in ds.take(batches)]


@pytest.fixture(scope="module")
def arrays_source():
    images, labels = _indexed_arrays(CLASSES * PER_CLASS * 10 // 9 + 1, CLASSES)
    return data_lib.open_source(_config(), dataset=(images, labels))


def test_the_first_batches_of_a_class_sorted_source_are_a_sample_of_every_class(arrays_source):
    assert arrays_source.shuffle_kind == "permutation"
    labels = np.concatenate([l for _, l in _stream(arrays_source, _config(), batches=12)])  # 600 examples
    counts = np.bincount(labels, minlength=CLASSES)
    # Uniform over the 30 classes: a chi-square test at 0.1% (blocks of 500 would give ~5 classes).
    assert stats.chisquare(counts).pvalue > 1e-3, counts
    assert (counts > 0).all()


def test_one_epoch_visits_every_example_once_and_the_next_one_reorders(arrays_source):
    size = arrays_source.sizes["train"]
    ids = np.concatenate([i for i, _ in _stream(arrays_source, _config(batch_size=100), batches=2 * size // 100 + 1)])
    first, second = ids[:size], ids[size:2 * size]
    assert set(first) == set(second) and len(set(first)) == size
    assert not np.array_equal(first, second)


def test_resuming_mid_epoch_continues_the_same_stream(arrays_source):
    config = _config()
    straight = np.concatenate([i for i, _ in _stream(arrays_source, config, batches=80)])  # past one epoch
    resumed = np.concatenate([i for i, _ in _stream(arrays_source, config, examples_seen=2_950, batches=21)])
    np.testing.assert_array_equal(resumed, straight[2_950:2_950 + len(resumed)])


@pytest.mark.slow
def test_two_workers_shards_are_disjoint_and_cover_the_data(arrays_source):
    size = arrays_source.sizes["train"]
    config = _config(batch_size=2)  # 1 per replica
    seen = []
    for worker in range(2):
        shard = arrays_source.shard_size("train", worker, 2)
        ids = np.concatenate([i for i, _ in _stream(arrays_source, config, pipeline=worker, pipelines=2,
                                                    batches=shard)])
        assert len(set(ids)) == shard
        seen.append(set(ids))
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == size


def _write_records(folder, per_file_labels, per_file=200):
    """TFRecord files train-NNNNN.tfrecord, each holding one class (class-sorted storage)."""
    import io

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    index = 0
    for f, label in enumerate(per_file_labels):
        for split in ("train", "validation"):
            path = folder / f"{split}-{f:05d}.tfrecord"
            with tf.io.TFRecordWriter(str(path)) as writer:
                for _ in range(per_file if split == "train" else 2):
                    buffer = io.BytesIO()
                    pixels = np.full((2, 2, 3), 0, np.uint8)
                    pixels[0, 0, 0], pixels[0, 1, 0] = index % 256, index // 256
                    Image.fromarray(pixels).save(buffer, "PNG")
                    index += 1
                    example = tf.train.Example(features=tf.train.Features(feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buffer.getvalue()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
                    writer.write(example.SerializeToString())
    return folder


@pytest.mark.slow
def test_record_files_are_reordered_and_interleaved_each_epoch(tmp_path):
    root = _write_records(tmp_path / "records", per_file_labels=list(range(20)))  # 4,000 records, one class a file
    config = _config(dataset=f"tfrecord:{root}", num_classes=20)
    source = data_lib.open_source(config)
    assert source.shuffle_kind == "files"
    assert data_lib.check_stream_mixing(source, config) is None  # 16 files interleaved: no warning
    labels = np.concatenate([l for _, l in _stream_rgb(source, config, batches=8)])
    assert len(np.unique(labels)) >= 16  # the first 400 examples, where one file held one class
    epoch_orders = [stream_lib._epochs(source, 0, 1, 0, 0, BUFFER, None)(tf.constant(e, tf.int64)) for e in (0, 1)]
    firsts = [[int(x[1]) for x in ds.take(40).as_numpy_iterator()] for ds in epoch_orders]
    assert firsts[0] != firsts[1]  # another file order in epoch 1


def _stream_rgb(source, config, batches):
    context = tf.distribute.InputContext()
    ds = data_lib.train_dataset(source, plan_of(source, (2, 2), 3, config), context, 0)
    return [(None, b["label"].numpy()) for b in ds.take(batches)]


def test_a_class_sorted_stream_in_one_file_warns_once(tmp_path, capsys):
    images, labels = _indexed_arrays(3_000, CLASSES)
    single = tf.data.Dataset.from_tensor_slices((images, labels))  # a stream: no random access
    config = _config()
    source = data_lib.open_source(config, dataset=single)
    assert source.shuffle_kind == "buffer"
    message = data_lib.check_stream_mixing(source, config)
    assert message and "hold only" in message and "shuffle_buffer" in message
    assert capsys.readouterr().err.count("keras-vit: warning:") == 1
    assert data_lib.check_stream_mixing(source, _config(shuffle_buffer=10_000)) is None


def test_a_dataset_of_images_of_varying_sizes_shuffles_in_blocks(tmp_path):
    """The docs allow a tf.data.Dataset of images of any size: blocks of raw
    examples are shuffled, so they must batch whatever the sizes (#29)."""
    sizes = [(5 + i % 7, 4 + i % 5) for i in range(30)]
    ds = tf.data.Dataset.from_generator(
        lambda: ((np.full((h, w, 3), i, np.uint8), i % 3) for i, (h, w) in enumerate(sizes)),
        output_signature=(tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([], tf.int64)))
    config = TrainConfig.create("scratch", model="Nano/4", train_augment="none", shuffle_buffer=8, batch_size=9,
                                image_size=4)
    source = data_lib.open_source(config, ds)
    assert source.shuffle_kind == "buffer" and source.image_size is None
    batches = list(data_lib.train_dataset(source, plan_of(source, (4, 4), 3, config), tf.distribute.InputContext(),
                                          0).take(3).as_numpy_iterator())
    seen = [int(round((v + 1) * 127.5)) for b in batches for v in b["image"][:, 0, 0, 0]]
    train_values = [i for i in range(30) if i % 10 != 9]  # every 10th held out
    assert sorted(seen) == train_values and seen != train_values  # one epoch, whole and shuffled
