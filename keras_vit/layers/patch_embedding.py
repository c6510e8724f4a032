"""Split an image (or a ResNet feature map) into patches and project each to D."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """A conv with kernel = stride = patch size, flattened to a token sequence.

    Args:
        hidden_size: token width D.
        patch_size: patch side in input pixels (or feature-map cells).
        use_bias: the projection's bias (CLIP's patch embedding has none).

    Input (B, H, W, C) -> output (B, (H / p) * (W / p), D), row-major over the
    patch grid, as the official implementation flattens it.
    """

    def __init__(self, hidden_size, patch_size, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.use_bias = bool(use_bias)
        self.hidden_size = int(hidden_size)
        self.patch_size = int(patch_size)
        self.projection = keras.layers.Conv2D(
            self.hidden_size,
            kernel_size=self.patch_size,
            strides=self.patch_size,
            padding="valid",
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.LecunNormal(),
            name="projection",
            dtype=self.dtype_policy,
        )

    def build(self, input_shape):
        height, width = input_shape[1], input_shape[2]
        for side, size in (("height", height), ("width", width)):
            if size is not None and size % self.patch_size:
                raise ValueError(
                    f"Input {side} {size} is not divisible by the patch size "
                    f"{self.patch_size}: use an image size that is a multiple of "
                    f"{self.patch_size}."
                )
        self.projection.build(input_shape)

    def call(self, images):
        x = self.projection(images)  # (B, H/p, W/p, D)
        batch = ops.shape(x)[0]
        return ops.reshape(x, (batch, -1, self.hidden_size))  # (B, N, D)

    def compute_output_shape(self, input_shape):
        h, w = input_shape[1], input_shape[2]
        n = None if h is None or w is None else (h // self.patch_size) * (w // self.patch_size)
        return (input_shape[0], n, self.hidden_size)

    def get_config(self):
        config = {**super().get_config(), "hidden_size": self.hidden_size, "patch_size": self.patch_size}
        if not self.use_bias:  # older files lack the key: they all have a bias
            config["use_bias"] = False
        return config
