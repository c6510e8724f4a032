import numpy as np
import tensorflow as tf

from keras_vit.layers import BottleneckUnit, ResNetStem
from tests.layers.helpers import assert_config_round_trip
from tests.layers.test_std_conv import standardise


def group_norm(x, gamma, beta, groups=32, eps=1e-6):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    return ((g - mean) / np.sqrt(var + eps)).reshape(b, h, w, c) * gamma + beta


def conv(x, w, stride):
    return tf.nn.conv2d(x, standardise(np.asarray(w)).astype("float32"), strides=stride, padding="SAME").numpy()


def unit_reference(unit, x):
    def gn(layer, y):
        return group_norm(y, np.asarray(layer.gamma), np.asarray(layer.beta))

    residual = gn(unit.gn_proj, conv(x, unit.conv_proj.kernel, unit.strides)) if unit.needs_projection else x
    y = np.maximum(gn(unit.gn1, conv(x, unit.conv1.kernel, 1)), 0)
    y = np.maximum(gn(unit.gn2, conv(y, unit.conv2.kernel, unit.strides)), 0)
    y = gn(unit.gn3, conv(y, unit.conv3.kernel, 1))
    return np.maximum(residual + y, 0)


def randomise(layer, rng):
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5 + (1.0 if "gamma" in v.path else 0.0)
                       for w, v in zip(layer.get_weights(), layer.weights)])


def test_bottleneck_with_projection_matches_reference(rng):
    unit = BottleneckUnit(features=32, strides=2)
    x = rng.normal(size=(2, 9, 9, 64)).astype("float32")
    unit.build(x.shape)
    assert unit.needs_projection
    randomise(unit, rng)
    out = np.asarray(unit(x))
    assert out.shape == (2, 5, 5, 128)
    np.testing.assert_allclose(out, unit_reference(unit, x), rtol=1e-3, atol=1e-3)


def test_bottleneck_identity_residual(rng):
    unit = BottleneckUnit(features=32, strides=1)
    x = np.abs(rng.normal(size=(1, 4, 4, 128))).astype("float32")
    unit.build(x.shape)
    assert not unit.needs_projection
    # gn3 starts at scale 0: a fresh unit is relu(x).
    np.testing.assert_allclose(np.asarray(unit(x)), x, rtol=1e-6)
    randomise(unit, rng)
    np.testing.assert_allclose(np.asarray(unit(x)), unit_reference(unit, x), rtol=1e-3, atol=1e-3)


def test_stem_root_and_pool_match_tf_same(rng):
    stem = ResNetStem(num_layers=(1,), width_factor=1)
    x = rng.normal(size=(1, 30, 30, 3)).astype("float32")
    stem(x)
    randomise(stem, rng)
    root = np.maximum(group_norm(conv(x, stem.conv_root.kernel, 2), np.asarray(stem.gn_root.gamma),
                                 np.asarray(stem.gn_root.beta)), 0)
    pooled = tf.nn.max_pool2d(root, 3, 2, "SAME").numpy()
    expected = unit_reference(stem.units[0], pooled)
    np.testing.assert_allclose(np.asarray(stem(x)), expected, rtol=1e-3, atol=1e-3)


def test_stage_layout_and_checkpoint_keys():
    stem = ResNetStem(num_layers=(3, 4, 9))
    out = stem.compute_output_shape((None, 224, 224, 3))
    stem.build((None, 224, 224, 3))
    assert out == (None, 14, 14, 1024)
    assert stem.checkpoint_keys[:4] == ["block1/unit1", "block1/unit2", "block1/unit3", "block2/unit1"]
    assert [u.strides for u in stem.units[:5]] == [1, 1, 1, 2, 1]
    assert [u.needs_projection for u in stem.units[:5]] == [True, False, False, True, False]


def test_config_round_trip(rng):
    assert_config_round_trip(BottleneckUnit(32, 2), rng.normal(size=(1, 8, 8, 32)).astype("float32"))
    assert_config_round_trip(ResNetStem((1, 1)), rng.normal(size=(1, 16, 16, 3)).astype("float32"))
