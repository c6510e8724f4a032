"""The tf.distribute trainer (installed as keras_vit.training)."""
