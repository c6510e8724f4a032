"""The few-shot linear evaluation (closed-form least squares onto {-1, 1})."""

import numpy as np
import pytest

from keras_vit.training import few_shot_linear_eval, fit_least_squares


def test_least_squares_matches_numpy_in_both_forms():
    rng = np.random.default_rng(0)
    for n, d in ((50, 8), (8, 50)):  # primal (n >= d) and dual (n < d) solutions
        x, labels = rng.normal(size=(n, d)), rng.integers(0, 3, n)
        weights, bias = fit_least_squares(x, labels, 3, l2_reg=0.5)
        targets = 2 * np.eye(3)[labels] - 1
        xc = x - x.mean(0)
        expected = np.linalg.solve(xc.T @ xc + 0.5 * np.eye(d), xc.T @ (targets - targets.mean(0)))
        np.testing.assert_allclose(weights, expected, atol=1e-8)
        np.testing.assert_allclose(bias, targets.mean(0) - x.mean(0) @ expected, atol=1e-8)


def test_few_shot_accuracy_grows_with_shots_on_separable_features():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(5, 32)) * 2.0

    def sample(n):
        labels = rng.integers(0, 5, n)
        return centres[labels] + rng.normal(size=(n, 32)) * 2.0, labels

    train_x, train_y = sample(500)
    test_x, test_y = sample(1000)
    results = few_shot_linear_eval(train_x, train_y, test_x, test_y, shots=(1, 5, 25), l2_reg=1.0)
    assert set(results) == {1, 5, 25}
    assert results[25] > 0.9 and results[25] >= results[1] and results[1] > 0.3  # chance: 0.2
    assert few_shot_linear_eval(train_x, train_y, test_x, test_y, shots=(5,)) == \
        few_shot_linear_eval(train_x, train_y, test_x, test_y, shots=(5,))


def test_too_few_examples_for_the_shots_is_an_error():
    with pytest.raises(ValueError, match="needs 5 examples of class 1"):
        few_shot_linear_eval(np.zeros((6, 2)), np.array([0, 0, 0, 0, 0, 1]), np.zeros((2, 2)), np.array([0, 1]),
                             shots=(5,))
