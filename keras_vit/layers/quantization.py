"""The dtype policy of a quantised projection: what an encoder block gives its
Dense and EinsumDense layers under ViTConfig.quantization.

Keras quantises those layers itself (`layer.quantize(mode)`: int8 kernels with
per-channel scales, activations quantised per token; int4 kernels packed two
per byte with a scale and zero point per group of input rows). A quantised layer built from its config must be given
the quantised policy before it builds, or it builds float variables that the
saved integer ones do not fit: our blocks build their projections themselves,
so they ask here which policy to give them.
"""

import keras

# Rows of the kernel that share an int4 scale: Keras' default (GPTQ's usual group), written
# down here because a model built from its config must use the size its weights were made with.
INT4_BLOCK_SIZE = 128


def projection_policy(policy, mode):
    """`policy` (the block's float policy) for a projection quantised in `mode`
    ("int8", "int4"); `policy` itself for None."""
    if not mode:
        return policy
    source = keras.dtype_policies.get(policy).name
    if mode == "int4":
        return keras.dtype_policies.Int4DTypePolicy(f"int4/{INT4_BLOCK_SIZE}", source)
    return keras.dtype_policies.QuantizedDTypePolicy(mode, source)


def quantization_config(mode):
    """What `layer.quantize(mode, config=...)` takes so that its weights fit
    `projection_policy`'s layer: int4's group size; None for the other modes."""
    if mode == "int4":
        return keras.quantizers.Int4QuantizationConfig(block_size=INT4_BLOCK_SIZE)
    return None
