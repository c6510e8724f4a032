"""The position-wise MLP of an encoder block."""

import keras
from keras import ops

from keras_vit.layers import fused
from keras_vit.layers.lora import LowRankUpdate, check_lora
from keras_vit.layers.quantization import projection_policy
from keras_vit.layers.stochastic_depth import seed_generators_of


@keras.saving.register_keras_serializable(package="keras_vit")
class MlpBlock(keras.layers.Layer):
    """Dense(mlp_dim) -> GELU -> dropout -> Dense(D) -> dropout.

    `gelu_approximate=True` is the tanh approximation of the official code;
    False is the exact (erf) GELU of HF transformers, timm and keras-hub.
    `activation="quick_gelu"` is CLIP's x * sigmoid(1.702 x); "swiglu" is
    DINOv2's gated unit: Dense_0 maps to 2 * mlp_dim, silu(first half) times
    the second half goes on (the column order of transformers' weights_in).

    Initialisation as the official code: Xavier-uniform kernels, biases
    normal(stddev=1e-6).

    lora: {"rank", "alpha", "targets"}: with "mlp" among the targets, a
    LowRankUpdate beside both Dense layers (LoRA, keras_vit.model.lora).
    quantization: "int8" or "int4": both Dense layers are built
    quantised (keras_vit.layers.quantization); None: float.
    use_bias: False builds both Dense layers without biases (AIMv2's mlp_bias=False).
    """

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=True, activation="gelu", lora=None,
                 quantization=None, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.use_bias = bool(use_bias)
        self.lora = check_lora(lora)
        self.quantization = quantization or None
        self.dense_0_lora = self.dense_1_lora = None  # LowRankUpdates, set in build
        self.activation = activation
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.gelu_approximate = bool(gelu_approximate)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    @property
    def seed_generators(self):
        """The random state of this layer's dropout (what EncoderBlock's remat rewinds)."""
        return seed_generators_of(self.dropout)

    def build(self, input_shape):
        bias_init = keras.initializers.RandomNormal(stddev=1e-6)
        gated = 2 if self.activation == "swiglu" else 1
        self.dense_0 = keras.layers.Dense(
            gated * self.mlp_dim, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
            use_bias=self.use_bias, name="Dense_0", dtype=projection_policy(self.dtype_policy, self.quantization),
        )
        self.dense_1 = keras.layers.Dense(
            input_shape[-1], kernel_initializer="glorot_uniform", bias_initializer=bias_init,
            use_bias=self.use_bias, name="Dense_1", dtype=projection_policy(self.dtype_policy, self.quantization),
        )
        self.dense_0.build(input_shape)  # (D, mlp_dim), or (D, 2 * mlp_dim) gated
        self.dense_1.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        if self.lora and "mlp" in self.lora["targets"]:
            rank, alpha = self.lora["rank"], self.lora["alpha"]
            self.dense_0_lora = LowRankUpdate(rank, alpha, (gated * self.mlp_dim,), name="Dense_0_lora",
                                              dtype=self.dtype_policy)
            self.dense_1_lora = LowRankUpdate(rank, alpha, (input_shape[-1],), name="Dense_1_lora",
                                              dtype=self.dtype_policy)
            self.dense_0_lora.build(input_shape)
            self.dense_1_lora.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

    # Set by the trainer (keras_vit.training) when its step is not XLA-compiled:
    # the GELU as one kernel each way in training (keras_vit.layers.fused).
    # Not part of the config: it changes no output or gradient.
    fused_gelu = False

    def call(self, x, training=False):
        x = self._activate(self._dense(0, x), training)
        x = self.dropout(x, training=training)
        return self.dropout(self._dense(1, x), training=training)

    def _dense(self, index, x):
        """Dense_{index} of x, plus its low-rank update where it has one."""
        y = getattr(self, f"dense_{index}")(x)
        update = getattr(self, f"dense_{index}_lora")
        return y if update is None else y + update(x)

    def _activate(self, x, training):
        if self.activation == "quick_gelu":
            return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)
        if self.activation == "swiglu":
            gate, value = x[..., :self.mlp_dim], x[..., self.mlp_dim:]
            return ops.silu(gate) * value
        gelu = fused.gelu if self.fused_gelu and fused.active(training) else keras.activations.gelu
        return gelu(x, approximate=self.gelu_approximate)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {**super().get_config(), "mlp_dim": self.mlp_dim, "dropout_rate": self.dropout_rate,
                  "gelu_approximate": self.gelu_approximate}
        if self.activation != "gelu":  # older files lack the key: they are all GELU
            config["activation"] = self.activation
        if self.lora:
            config["lora"] = self.lora
        if self.quantization:
            config["quantization"] = self.quantization
        if not self.use_bias:
            config["use_bias"] = False
        return config
