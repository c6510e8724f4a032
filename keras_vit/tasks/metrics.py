"""Per-example metrics shared by every task."""

from __future__ import annotations

import tensorflow as tf


def top_k_hits(logits, labels, k):
    """1.0 where the true class is among the top k, else 0.0; shape of `labels`.

    A hit means fewer than k *other* classes have a logit >= the true
    class's logit. Ties count against the true class, so a model whose
    logits all tie (a zero-initialised head) scores 0 at every k below the
    number of classes -- unlike tf.nn.in_top_k, which counts ties as hits.
    A NaN true logit is a miss.

    Args:
        logits: (..., K) float.
        labels: (...) int class indices in [0, K).
        k: int; k >= K makes every finite prediction a hit.
    """
    logits = tf.convert_to_tensor(logits)
    labels = tf.cast(labels, tf.int32)
    true_logit = tf.gather(logits, labels[..., None], batch_dims=labels.shape.rank)  # (..., 1)
    others = tf.logical_not(tf.cast(tf.one_hot(labels, tf.shape(logits)[-1]), tf.bool))
    at_least = tf.reduce_sum(tf.cast(tf.logical_and(logits >= true_logit, others), tf.int32), axis=-1)
    hit = tf.logical_and(at_least < k, tf.logical_not(tf.math.is_nan(true_logit[..., 0])))
    return tf.cast(hit, tf.float32)
