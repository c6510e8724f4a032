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


def _tensorflow_warnings(run):
    """The messages TensorFlow's logger records while `run()` runs."""
    import logging

    import tensorflow as tf

    messages = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    keep = Keep(logging.WARNING)
    tf.get_logger().addHandler(keep)
    try:
        run()
    finally:
        tf.get_logger().removeHandler(keep)
    return messages


def test_feature_extraction_of_several_models_and_batch_sizes_does_not_retrace():
    """#30: our few-shot code traces each model's predict function once per batch shape class (Keras' own,
    relaxed after the second shape), never per call."""
    import keras
    import tensorflow as tf

    from keras_vit.training.evaluation import extract_features

    models = []

    def run():
        for _ in range(3):
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
            models.append(model)
            for n in (10, 7, 23):
                data = {"image": np.ones((n, 8), "float32"), "label": np.arange(n)}
                features, labels = extract_features(model, tf.data.Dataset.from_tensor_slices(data).batch(4))
                assert features.shape == (n, 4) and list(labels) == list(range(n))

    run()
    # Counted on each model's own predict function: TensorFlow's retracing warning counts the
    # traces of every Keras model's predict function in the process together (one code object),
    # so earlier tests in the same worker could set it off; these counts are this test's alone.
    # Batches of 4, 2, 3 and 4: the first shape, then one relaxed trace for any batch size.
    assert [model.predict_function.experimental_get_tracing_count() for model in models] == [2, 2, 2]


@pytest.mark.slow
def test_training_on_a_tf_data_dataset_makes_tensorflow_warn_nothing(tmp_path):
    """#30: AutoGraph could not transform the lambdas that hold out every 10th example."""
    import tensorflow as tf

    from keras_vit.training import TrainConfig, train

    images = np.random.default_rng(0).integers(0, 255, (40, 28, 28, 1)).astype("uint8")
    dataset = tf.data.Dataset.from_tensor_slices((images, np.arange(40) % 2))
    config = TrainConfig.create("scratch", model="Nano/4", patch_size=7, workdir=str(tmp_path), steps=2, batch_size=8,
                                warmup_steps=0, progress=False, strategy="default", jit_compile=False,
                                eval_batch_size=8, fewshot_shots=(1,))
    warnings = _tensorflow_warnings(lambda: train(config, dataset=dataset))
    assert not [m for m in warnings if "AutoGraph" in m or "retracing" in m], warnings
