"""The paper's few-shot linear evaluation on frozen features.

For k shots, k training images per class are embedded by the frozen model
and a linear map onto {-1, 1}^C targets (+1 for the true class) is fitted
in closed form by regularised least squares; test accuracy is the argmax of
that map. Only numpy: any model (classification or a pre-training task)
that yields features can use it.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional

import numpy as np

from keras_vit.errors import UserError


def fit_least_squares(features: np.ndarray, labels: np.ndarray, num_classes: int, l2_reg: float = 1.0):
    """(W, b) minimising ||(X - mu) W + b - Y||^2 + l2_reg ||W||^2, Y in {-1, 1}.

    The bias is not regularised (features are centred). Uses the dual form
    when there are fewer examples than feature dimensions.
    """
    x = np.asarray(features, np.float64)
    targets = 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0  # (n, C) in {-1, 1}
    mean = x.mean(0)
    xc = x - mean
    target_mean = targets.mean(0)
    tc = targets - target_mean
    n, d = xc.shape
    if n < d:
        weights = xc.T @ np.linalg.solve(xc @ xc.T + l2_reg * np.eye(n), tc)
    else:
        weights = np.linalg.solve(xc.T @ xc + l2_reg * np.eye(d), xc.T @ tc)
    bias = target_mean - mean @ weights
    return weights, bias


def few_shot_linear_eval(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    shots: Iterable[int] = (1, 5, 10, 25),
    l2_reg: float = 1.0,
    num_classes: Optional[int] = None,
    seed: int = 0,
) -> Dict[int, float]:
    """Test accuracy of the closed-form linear probe for each shot count.

    Args:
        train_features, train_labels: the pool the k shots per class are drawn
            from (without replacement, seeded).
        test_features, test_labels: where accuracy is measured.
        shots: images per class.
        l2_reg: ridge regularisation.
        num_classes: default max label + 1.
        seed: which shots are drawn.
    Returns:
        {k: accuracy in [0, 1]}.
    """
    train_labels = np.asarray(train_labels).astype(np.int64)
    test_labels = np.asarray(test_labels).astype(np.int64)
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(train_labels == c) for c in range(num_classes)]
    results = {}
    for k in shots:
        chosen = []
        for c, members in enumerate(by_class):
            if len(members) < k:
                raise UserError(f"{k}-shot evaluation needs {k} examples of class {c}, the pool has {len(members)}.")
            chosen.append(rng.choice(members, size=k, replace=False))
        chosen = np.concatenate(chosen)
        weights, bias = fit_least_squares(train_features[chosen], train_labels[chosen], num_classes, l2_reg)
        predictions = np.argmax(np.asarray(test_features, np.float64) @ weights + bias, axis=1)
        results[int(k)] = float(np.mean(predictions == test_labels))
    return results


def extract_features(feature_model, batches) -> tuple:
    """(features, labels) of a dataset of {"image", "label"[, "weight"]} batches;
    weight-0 (padding) examples are dropped."""
    # Keras' own predict function: compiled once per model, for any batch size
    # (a tf.function made here on each call retraced, and TensorFlow warned).
    features, labels = [], []
    for batch in batches:
        keep = np.asarray(batch["weight"]) > 0 if "weight" in batch else slice(None)
        features.append(np.asarray(feature_model.predict_on_batch(batch["image"]), np.float32)[keep])
        labels.append(np.asarray(batch["label"])[keep])
    return np.concatenate(features), np.concatenate(labels)
