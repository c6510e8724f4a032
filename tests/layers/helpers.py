"""Checks every layer gets: a config that round-trips and a serialised copy
that computes the same thing."""

import keras
import numpy as np


def assert_config_round_trip(layer, inputs):
    """from_config(get_config()) rebuilds a layer with the same config that,
    given the same weights, gives the same outputs."""
    outputs = keras.ops.convert_to_numpy(layer(inputs))
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone(inputs)  # build
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clone(inputs)), outputs, rtol=1e-6, atol=1e-6)
    # And through Keras' own serialisation (registered class names).
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer) and restored.get_config() == config
