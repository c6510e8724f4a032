"""LayerScale: a learned per-channel scale on a residual branch (CaiT; DINOv2)."""

import keras


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """x * gamma, gamma (D,) initialised to `init_value` (DINOv2: 1.0; CaiT
    small values so that deep stacks start near the identity)."""

    def __init__(self, init_value=1.0, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                     initializer=keras.initializers.Constant(self.init_value))

    def call(self, x):
        return x * keras.ops.cast(self.scale, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}
