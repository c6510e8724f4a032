"""Issue #24: the regularising augmentations (keras_vit.training.augment)
against references: Pillow's ImageOps / ImageEnhance for the RandAugment
ops, hand-computed cases for the geometric ops, Mixup, CutMix and random
erasing; and the stream's repeated augmentation."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from keras_vit.training import TrainConfig
from keras_vit.training import augment
from keras_vit.training import data as data_lib
from tests.training_helpers import plan_of

SEED = tf.constant([3, 7], tf.int64)


def _photo(seed=0, size=(20, 24)):
    """A smooth RGB image with every level used unevenly (equalize has work to do)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:size[0], :size[1]]
    base = np.stack([x * 9.0, y * 11.0, (x + y) * 5.0], -1) + rng.integers(0, 40, (*size, 3))
    return np.clip(base, 0, 255).astype(np.uint8)


def _op(name, image, magnitude, sign=1.0):
    return augment.apply_op(name, tf.constant(image, tf.float32), magnitude, sign).numpy()


def test_keras_random_ops_refuse_a_tensor_seed():
    # Why the ops are ours: a per-example seed only exists as a tensor in the
    # tf.data graph, and Keras' layers draw through keras.random.
    import keras

    with pytest.raises(ValueError, match="seed"):
        keras.random.uniform((1,), seed=tf.constant([1, 2]))


@pytest.mark.parametrize("name,reference", [
    ("invert", ImageOps.invert),
    ("equalize", ImageOps.equalize),
    ("auto_contrast", ImageOps.autocontrast),
    ("solarize", lambda im: ImageOps.solarize(im, threshold=256 - int(256 * 0.5))),
    ("posterize", lambda im: ImageOps.posterize(im, 8 - int(4 * 0.5))),
    ("brightness", lambda im: ImageEnhance.Brightness(im).enhance(1.45)),
    ("color", lambda im: ImageEnhance.Color(im).enhance(1.45)),
    ("contrast", lambda im: ImageEnhance.Contrast(im).enhance(1.45)),
    ("sharpness", lambda im: ImageEnhance.Sharpness(im).enhance(1.45)),
])
def test_pixel_ops_match_pillow(name, reference):
    image = _photo()
    ours = _op(name, image, 5)  # magnitude 5: m = 0.5, enhance factor 1 + 0.9 x 0.5
    expected = np.asarray(reference(Image.fromarray(image)), np.float32)
    # Pillow rounds each result to uint8 (and its contrast uses the rounded mean grey).
    assert np.abs(ours - expected).max() <= 1.5, name


@pytest.mark.parametrize("name", sorted(set(augment.OPS) - {"invert", "equalize", "auto_contrast"}))
def test_magnitude_zero_is_the_identity(name):
    image = _photo(1).astype(np.float32)
    np.testing.assert_allclose(_op(name, image, 0), image, atol=1e-3)


def test_rotate_by_ninety_degrees_and_translate_by_whole_pixels():
    image = _photo(2, size=(16, 16)).astype(np.float32)
    # Magnitude 30: 30 x 3 = 90 degrees: a square image turns exactly.
    turned = _op("rotate", image, 30, 1.0)
    assert min(np.abs(turned - np.rot90(image, k)).max() for k in (1, 3)) < 1e-3
    # 0.45 x m of the side, rounded: magnitude 10 with sign -1 on a 16-pixel side: 7 pixels.
    shifted = _op("translate_x", image, 10, -1.0)
    np.testing.assert_allclose(shifted[:, 7:], image[:, :-7], atol=1e-3)
    np.testing.assert_allclose(shifted[:, :7], augment.FILL)


def test_shear_moves_each_row_by_its_distance_from_the_centre():
    image = np.full((9, 9, 1), augment.FILL, np.float32)  # the fill: what comes in from outside matches
    image[:, 4] += 72.0  # a vertical line through the centre
    sheared = _op("shear_x", image, 10, 1.0)[..., 0] - augment.FILL  # s = 0.3: input x = x + 0.3 (y - 4)
    for row in (0, 4, 8):
        expected_column = 4 - 0.3 * (row - 4)
        centre = (sheared[row] * np.arange(9)).sum() / sheared[row].sum()
        assert abs(centre - expected_column) < 1e-3, (row, centre)


def test_randaugment_is_a_function_of_its_seed():
    image = tf.constant(_photo(3), tf.float32)
    a = augment.randaugment(image, 2, 15, SEED).numpy()
    b = augment.randaugment(image, 2, 15, SEED).numpy()
    np.testing.assert_array_equal(a, b)
    others = [augment.randaugment(image, 2, 15, tf.constant([3, s], tf.int64)).numpy() for s in range(8, 16)]
    assert sum(not np.array_equal(a, o) for o in others) >= 6
    np.testing.assert_array_equal(augment.randaugment(image, 0, 15, SEED).numpy(), image.numpy())


def test_random_erasing_fills_one_box_of_the_allowed_size_with_noise():
    image = tf.zeros([32, 32, 3])
    for s in range(20):
        seed = tf.constant([s, 1], tf.int64)
        erased = augment.random_erasing(image, 1.0, seed).numpy()
        changed = np.any(erased != 0, axis=-1)
        rows, cols = np.nonzero(changed)
        assert changed.sum() == (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)  # one box
        assert 0.02 * 1024 * 0.8 <= changed.sum() <= 1024 / 3 * 1.1
        assert 0.5 < erased[changed].std() < 1.5  # N(0, 1) noise
        np.testing.assert_array_equal(augment.random_erasing(image, 0.0, seed).numpy(), image.numpy())


def _group(k=1, size=8):
    images = tf.stack([tf.fill([size, size, 1], float(i + 1)) for i in range(2 * k)])
    return {"image": images, "label": tf.range(2 * k, dtype=tf.int32), "weight": tf.ones([2 * k])}


def test_mixup_blends_each_pair_both_ways_with_the_beta_draw():
    out = augment.mix_group(_group(), 1, mixup=0.8, cutmix=0.0, mix_prob=1.0, switch_prob=0.5, seed=SEED)
    lam = float(out["mix_lambda"][0])
    assert 0 < lam < 1 and float(out["mix_lambda"][1]) == lam
    np.testing.assert_allclose(out["image"][0].numpy(), lam * 1 + (1 - lam) * 2, rtol=1e-6)
    np.testing.assert_allclose(out["image"][1].numpy(), lam * 2 + (1 - lam) * 1, rtol=1e-6)
    assert out["mix_label"].numpy().tolist() == [1, 0]
    # The draw is Beta(0.8, 0.8): its mean 1/2 and variance 1/(4 (2 alpha + 1)) over many seeds.
    draws = [float(augment.sample_beta(0.8, tf.constant([s, 0], tf.int64))) for s in range(400)]
    assert abs(np.mean(draws) - 0.5) < 0.05 and abs(np.var(draws) - 1 / (4 * 2.6)) < 0.02


def test_cutmix_pastes_a_box_and_lambda_is_the_area_kept():
    for s in range(10):
        out = augment.mix_group(_group(size=16), 1, mixup=0.0, cutmix=1.0, mix_prob=1.0, switch_prob=0.5,
                                seed=tf.constant([s, 2], tf.int64))
        first = out["image"][0, ..., 0].numpy()
        kept = (first == 1).mean()
        assert set(np.unique(first)) <= {1.0, 2.0}
        assert float(out["mix_lambda"][0]) == pytest.approx(kept)
        np.testing.assert_array_equal(out["image"][1, ..., 0].numpy() == 1, first == 2)  # the same box, swapped


def test_mix_prob_zero_and_partners_k_apart():
    unchanged = augment.mix_group(_group(), 1, mixup=1.0, cutmix=1.0, mix_prob=0.0, switch_prob=0.5, seed=SEED)
    np.testing.assert_array_equal(unchanged["image"].numpy(), _group()["image"].numpy())
    assert unchanged["mix_lambda"].numpy().tolist() == [1.0, 1.0]
    # With repeated augmentation K = 3: example j is mixed with j + 3, never with its own copies.
    out = augment.mix_group(_group(k=3), 3, mixup=1.0, cutmix=0.0, mix_prob=1.0, switch_prob=0.5, seed=SEED)
    assert out["mix_label"].numpy().tolist() == [3, 4, 5, 0, 1, 2]


def test_repeated_augmentation_repeats_each_example_k_times_differently_augmented():
    images = np.tile(np.arange(60, dtype=np.uint8)[:, None, None, None] * 4, (1, 8, 8, 1))
    source = data_lib.open_source(TrainConfig.create("scratch", progress=False),
                                  dataset=(images, np.arange(60) % 10))
    config = TrainConfig.create("scratch", model="Mu/4", batch_size=54, repeated_augmentation=3,
                                random_erasing=1.0, train_augment="none", progress=False)
    context = tf.distribute.InputContext()
    batch = next(iter(data_lib.train_dataset(source, plan_of(source, (8, 8), 1, config), context, 0)))
    pictures = batch["image"].numpy()
    # The erased box differs; the rest of each copy is the same example's pixels.
    ids = [np.median(p) for p in pictures]
    assert all(ids[3 * j] == ids[3 * j + 1] == ids[3 * j + 2] for j in range(18))
    assert len(set(ids)) == 18
    assert all(not np.array_equal(pictures[3 * j], pictures[3 * j + 1]) for j in range(18))


def test_an_unreadable_example_is_mixed_with_nothing():
    """The blank stand-in of a file that failed to decode (weight 0) must not
    lend its pixels or its label to its partner (#29)."""
    images = tf.stack([tf.fill([8, 8, 1], 0.5), tf.zeros([8, 8, 1]), tf.fill([8, 8, 1], -0.5), tf.fill([8, 8, 1], 0.25)])
    group = {"image": images, "label": tf.constant([0, 1, 2, 3]), "weight": tf.constant([1.0, 0.0, 1.0, 1.0])}
    mixed = augment.mix_group(group, 2, 0.8, 0.0, 1.0, 0.5, tf.constant([3, 4], tf.int64))
    # Pairs (0, 2) and (1, 3): example 3's partner is unreadable, so 3 (and 1) stay as they are.
    np.testing.assert_array_equal(mixed["image"][3], images[3])
    np.testing.assert_array_equal(mixed["mix_lambda"].numpy()[[1, 3]], [1.0, 1.0])
    assert float(mixed["mix_lambda"][0]) < 1.0 and float(mixed["mix_lambda"][2]) < 1.0  # the readable pair mixes


def test_the_inception_crop_antialiases_as_evaluation_does():
    """A 1-pixel checkerboard shrunk by the crop: antialiased it is a flat grey
    (as keras_vit.images.resize gives evaluation, predict and export);
    sampled without antialiasing it would keep black and white pixels."""
    board = tf.cast((tf.range(96)[:, None] + tf.range(96)[None, :]) % 2 * 255, tf.float32)[:, :, None]
    for seed in range(5):
        crop = augment.inception_crop(board, (8, 8), tf.constant([seed, 1], tf.int64))
        assert crop.shape == (8, 8, 1)
        assert float(tf.reduce_max(tf.abs(crop - 127.5))) < 5, seed
    unaliased = tf.image.resize(board[:61, :61], (8, 8))  # what the crop did before: far from grey
    assert float(tf.reduce_max(tf.abs(unaliased - 127.5))) > 90
