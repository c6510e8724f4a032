"""GELU and softmax as one kernel each way (forward, backward) for training
on TensorFlow.

Why: on a CPU, mixed_bfloat16 trains fastest without XLA (oneDNN's bfloat16
matmuls; XLA's run at half their speed), but then TensorFlow runs the GELU
and the attention softmax op by op, forward and backward, each op one more
pass over memory. Each function here is a tf.custom_gradient whose forward
and backward are each one small XLA-compiled function computing in float32;
the matmuls around them stay with oneDNN. Inside an XLA-compiled step they
are inlined like any other op. Measured at ViT-S/16, batch 16, bfloat16
without XLA (benchmarks/fused_ab.py, results in benchmarks/results_fused.md):
GELU forward + backward 3.6x faster, softmax 1.3x, the whole gradient
computation 1.17x. LayerNorm is left to Keras: a fused kernel for it
measured no faster (TensorFlow's oneDNN rewrite already fuses it).

Numerics: float32 inside (float64 for float64 inputs), as Keras' softmax
under mixed precision; Keras' GELU computes in the input dtype, this one in
float32, then rounds to the input dtype. The backward passes recompute
what they need from the forward's input instead of keeping intermediates.

Used only where `active(training)`: the TensorFlow backend, training. The
inference graph (and so every export: SavedModel, TFLite, ONNX) is the plain
Keras one.
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


def softmax(logits):
    """Softmax over the last axis."""
    return _kernels().softmax(logits)


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

    # Softmax over the last axis; the backward recomputes p from the logits.
    @xla
    def softmax_forward(z):
        return tf.cast(tf.nn.softmax(f32(z), axis=-1), z.dtype)

    @xla
    def softmax_backward(z, dp):
        p = tf.nn.softmax(f32(z), axis=-1)
        g = f32(dp)
        return tf.cast(p * (g - tf.reduce_sum(g * p, axis=-1, keepdims=True)), z.dtype)

    @tf.custom_gradient
    def softmax(z):
        return softmax_forward(z), lambda dp: softmax_backward(z, dp)

    return types.SimpleNamespace(gelu_tanh=gelu_tanh, gelu_erf=gelu_erf, softmax=softmax)
