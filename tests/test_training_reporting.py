"""keras_vit.training.reporting: the TensorBoard scalars it writes read back
as TensorBoard's scalars plugin expects them."""

import tensorflow as tf

from keras_vit.training import reporting


def test_scalars_are_tensorboard_scalars(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    reporting.write_scalars(writer, 7, {"train/loss": 0.25, "train/lr": 3})
    writer.flush()
    (events,) = tmp_path.glob("events.out.tfevents.*")
    values = [v for event in tf.compat.v1.train.summary_iterator(str(events)) for v in event.summary.value
              if event.step == 7]
    assert {v.tag: float(tf.make_ndarray(v.tensor)) for v in values} == {"train/loss": 0.25, "train/lr": 3.0}
    scalar = tf.compat.v1.SummaryMetadata(data_class="DATA_CLASS_SCALAR").data_class
    for v in values:
        assert v.metadata.plugin_data.plugin_name == "scalars" and v.metadata.data_class == scalar
