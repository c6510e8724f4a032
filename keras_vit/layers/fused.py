"""The GELU as one kernel each way (forward, backward) for training on
TensorFlow without XLA.

Why: on a CPU, mixed_bfloat16 trains fastest without XLA (oneDNN's bfloat16
matmuls; XLA's run at half their speed), but then TensorFlow runs the tanh
GELU op by op, forward and backward: about fifteen passes over the MLP's
widest activation. Here it is a tf.custom_gradient whose forward and backward
are each one small XLA-compiled function computing in float32; the matmuls
around it stay with oneDNN. It is faster there (benchmarks/fused_ab.py; the
figures, date and machine: benchmarks/results_fused.md). Under an
XLA-compiled step XLA fuses the GELU by itself, and the custom gradient
measured slower there, so the trainer sets MlpBlock.fused_gelu only when its
step is not XLA-compiled. The attention softmax and LayerNorm were tried the
same way and left out: no gain in the whole step (same page).

Numerics: float32 inside (float64 for float64 inputs), then rounded to the
input dtype (Keras' GELU computes in the input dtype). The backward pass
recomputes from the forward's input instead of keeping intermediates.

Used only where MlpBlock.fused_gelu and `active(training)`: the TensorFlow
backend, training. The inference graph (and so every export: SavedModel,
TFLite, ONNX) is the plain Keras one.
"""

import math

import keras

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715


def active(training) -> bool:
    """Whether layers take the fused kernels: TensorFlow, training (a Python
    True: a symbolic `training` keeps the plain path)."""
    return training is True and keras.backend.backend() == "tensorflow"


def gelu(x, approximate: bool):
    return _kernels().gelu_tanh(x) if approximate else _kernels().gelu_erf(x)


_KERNELS = None


def _kernels():
    """Built on first use: importing TensorFlow is left to the TF backend."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _build_kernels()
    return _KERNELS


def _build_kernels():
    import types

    import tensorflow as tf

    def xla(f):
        return tf.function(f, jit_compile=True, autograph=False, reduce_retracing=True)

    def f32(t):  # float32 at least (float64 stays)
        return t if t.dtype == tf.float64 else tf.cast(t, tf.float32)

    # GELU, tanh approximation: 0.5 x (1 + tanh(c (x + a x^3))).
    @xla
    def gelu_tanh_forward(x):
        v = f32(x)
        t = tf.tanh(_SQRT_2_OVER_PI * v * (1.0 + _TANH_CUBIC * v * v))
        return tf.cast(0.5 * v * (1.0 + t), x.dtype)

    @xla
    def gelu_tanh_backward(x, dy):
        v = f32(x)
        t = tf.tanh(_SQRT_2_OVER_PI * v * (1.0 + _TANH_CUBIC * v * v))
        slope = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _TANH_CUBIC * v * v)
        return tf.cast(f32(dy) * slope, x.dtype)

    @tf.custom_gradient
    def gelu_tanh(x):
        return gelu_tanh_forward(x), lambda dy: gelu_tanh_backward(x, dy)

    # GELU, exact: x Phi(x).
    @xla
    def gelu_erf_forward(x):
        v = f32(x)
        return tf.cast(0.5 * v * (1.0 + tf.math.erf(v * math.sqrt(0.5))), x.dtype)

    @xla
    def gelu_erf_backward(x, dy):
        v = f32(x)
        slope = 0.5 * (1.0 + tf.math.erf(v * math.sqrt(0.5))) + v * tf.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)
        return tf.cast(f32(dy) * slope, x.dtype)

    @tf.custom_gradient
    def gelu_erf(x):
        return gelu_erf_forward(x), lambda dy: gelu_erf_backward(x, dy)

    return types.SimpleNamespace(gelu_tanh=gelu_tanh, gelu_erf=gelu_erf)
