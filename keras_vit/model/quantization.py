"""Quantised ViTs: the encoder blocks' projections in int8 or int4, the rest float.

`quantize(model, mode)` gives a new ViT whose config says `quantization=mode`,
so it is built (and a `.keras` file of it loads) with quantised projections
(keras_vit.layers.quantization); Keras' own `quantize` of each float
projection makes the integer weights, so they are exactly Keras' int8/int4.

What is quantised is the parts description's "block" group, the encoder
blocks' query/key/value/out and MLP projections (not their LoRA updates): 93%
(Ti/16, S/32) to 99.6% (H/14) of a plain ViT's weights at 224 px with 1000
classes. The patch embedding and a hybrid's ResNet (convolutions, which Keras does
not quantise), the tokens, position tables and norms (small, and where
rounding costs the most), and the readout and classifier heads (under 1% of
the weights; the logits' precision lives there) stay float.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Dict, List, Optional, Tuple

import numpy as np

from keras_vit.config import QUANTIZATION_MODES
from keras_vit.errors import UserError
from keras_vit.layers.quantization import quantization_config


def projections(vit) -> List[Tuple[object, int]]:
    """(layer, input axes) of each Dense/EinsumDense layer a quantised ViT holds
    quantised: each block's query, key, value, out (which contracts two axes,
    heads and head width) and its MLP's two layers, in block order."""
    layers = []
    for block in vit.encoder.blocks:
        attention, mlp = block.attention, block.mlp
        layers += [(attention.query, 1), (attention.key, 1), (attention.value, 1), (attention.out, 2),
                   (mlp.dense_0, 1), (mlp.dense_1, 1)]
    return layers


def quantization_of(model) -> Optional[str]:
    """The quantisation mode of a ViT ("int8", ...), None for a float one or any other model."""
    config = getattr(model, "config", None)
    return getattr(config, "quantization", None)


def check_mode(mode) -> str:
    """`mode` if it is one of QUANTIZATION_MODES, else a one-line UserError naming them."""
    if mode == "float8":
        raise UserError("float8 is not a serving mode here: Keras' float8 is float8 training (weights stay float32, "
                        "its scales are learned while training on GPUs with float8 matmuls, such as H100), and at "
                        "its starting scales it rounds small weights away. Quantise with int8 or int4.")
    if mode not in QUANTIZATION_MODES:
        from keras_vit.utils.console import argument

        raise UserError(f"Unknown quantisation mode {mode!r}: choose {', '.join(QUANTIZATION_MODES)} "
                        f"(e.g. {argument('mode', 'int8')}).")
    return mode


def quantize(model, mode: str = "int8"):
    """A copy of the ViT `model` with its encoder blocks' projections quantised
    (`mode`: "int8" or "int4"; see the module docstring for what
    stays float). The copy computes what `model` computes up to the rounding
    of its weights (and, in int8, of the projections' inputs); `model` is
    left as it was. LoRA updates stay float and apart, as they were: a LoRA
    model quantised is QLoRA's form, its base integer and frozen, its updates
    training (`keras_vit.merge_lora` first, for a model to serve).
    """
    check_mode(mode)
    import keras

    if mode == "int8" and keras.config.dtype_policy().compute_dtype == "float16":
        raise UserError("int8 layers cannot compute in float16 (Keras sums their products in float16, which "
                        "overflows): quantise under the float32 or mixed_bfloat16 policy.")
    if model.config.quantization:
        raise UserError(f"{model.name} is quantised already ({model.config.quantization}): quantise the float "
                        f"model it was made from.")
    config = model.get_config()
    quantized = type(model).from_config({**config, "config": {**config["config"], "quantization": mode}})
    # Keras quantises each projection of a float copy; the results go across by path.
    twin = type(model).from_config(config)
    twin.set_weights(model.get_weights())
    with _young_garbage_only():
        for layer, _ in projections(twin):
            layer.quantize(mode, config=quantization_config(mode))
    values = {variable.path: variable for variable in twin.weights}
    targets = {variable.path: variable for variable in quantized.weights}
    if set(values) != set(targets):  # the build from the config and Keras' quantize must agree
        raise AssertionError(f"quantised weights differ: {sorted(set(values) ^ set(targets))[:6]}")
    for path, variable in targets.items():
        variable.assign(values[path])
    quantized.check_input_range = model.check_input_range
    return quantized


def dequantized(model):
    """A float ViT computing what the quantised ViT `model` computes with its
    weights as they are stored (int8 or int4 rounding kept), but
    with float inputs to every projection: each projection's float kernel is
    read by calling the quantised layer on the identity (one-hot rows
    quantise exactly in every mode), so it is Keras' own dequantisation.
    What the float-only runtimes (TFLite) are converted from."""
    mode = quantization_of(model)
    if not mode:
        return model
    config = model.get_config()
    with _float32_layers():  # the probe in float32 whatever the session's policy: bfloat16 would round it
        probed = type(model).from_config(config)
        probed.set_weights(model.get_weights())
        plain = type(model).from_config({**config, "config": {**config["config"], "quantization": None}})
    targets = {variable.path: variable for variable in plain.weights}
    for variable in model.weights:
        if variable.path in targets and tuple(variable.shape) == tuple(targets[variable.path].shape):
            targets[variable.path].assign(variable)  # everything float: norms, tokens, biases, heads
    for (layer, axes), (float_layer, _) in zip(projections(probed), projections(plain)):
        float_layer.kernel.assign(_float_kernel(layer, tuple(float_layer.kernel.shape), axes))
    plain.check_input_range = model.check_input_range
    return plain


@contextlib.contextmanager
def _float32_layers():
    """Layers built inside take float32 (Keras' global policy, restored after)."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _float_kernel(layer, kernel_shape, input_axes) -> np.ndarray:
    """The kernel (kernel_shape) the projection `layer` multiplies by: its outputs on the identity, less its bias."""
    inputs = kernel_shape[:input_axes]
    fan_in = int(np.prod(inputs))
    outputs = np.asarray(layer(np.eye(fan_in, dtype="float32").reshape(1, fan_in, *inputs)), np.float32)[0]
    if layer.bias is not None:
        outputs = outputs - np.asarray(layer.bias, np.float32)
    return outputs.reshape(kernel_shape)


@contextlib.contextmanager
def _young_garbage_only():
    """Keras runs a full garbage collection after each float kernel its quantize
    deletes: ~0.3 s a layer in a process holding TensorFlow, 20 s for a B/16.
    With the heap as it stands frozen (gc.freeze) those collections see only
    what quantising makes; the heap is unfrozen after. Left alone when the
    process has frozen objects of its own (a pre-fork server's), whose freeze
    unfreezing would undo."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def weight_bytes(model) -> int:
    """Bytes the model's weights take in memory (int4 kernels count as the
    int8 bytes Keras packs them in, two values each)."""
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights))


def weight_counts(model) -> Dict[str, int]:
    """{dtype: number of stored values} of the model's weights (packed int4 as int8 bytes)."""
    counts: Dict[str, int] = {}
    for variable in model.weights:
        counts[str(variable.dtype)] = counts.get(str(variable.dtype), 0) + int(np.prod(variable.shape))
    return counts
