import numpy as np
import pytest

from keras_vit.layers import EncoderBlock
from tests.layers import reference
from tests.layers.helpers import assert_config_round_trip


def block_params(block):
    a = block.attention
    return {
        "ln0_scale": np.asarray(block.attention_norm.gamma), "ln0_bias": np.asarray(block.attention_norm.beta),
        "ln2_scale": np.asarray(block.mlp_norm.gamma), "ln2_bias": np.asarray(block.mlp_norm.beta),
        "attention": [np.asarray(v) for s in (a.query, a.key, a.value, a.out) for v in (s.kernel, s.bias)],
        "mlp": [np.asarray(v) for v in (block.mlp.dense_0.kernel, block.mlp.dense_0.bias,
                                        block.mlp.dense_1.kernel, block.mlp.dense_1.bias)],
    }


def randomise(layer, rng, scale=0.3):
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * scale + (1.0 if "gamma" in v.path else 0.0)
                       for w, v in zip(layer.get_weights(), layer.weights)])


def test_pre_layernorm_block_matches_reference(rng):
    block = EncoderBlock(num_heads=4, mlp_dim=64)
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    block.build(x.shape)
    randomise(block, rng)
    np.testing.assert_allclose(np.asarray(block(x)), reference.encoder_block(x, block_params(block)),
                               rtol=1e-4, atol=1e-4)


def test_layer_norm_epsilon_is_the_official_one():
    block = EncoderBlock(num_heads=2, mlp_dim=8)
    assert block.attention_norm.epsilon == block.mlp_norm.epsilon == 1e-6


def test_returns_attention_probabilities(rng):
    block = EncoderBlock(num_heads=2, mlp_dim=8)
    x = rng.normal(size=(1, 4, 8)).astype("float32")
    y, probs = block(x, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(y), np.asarray(block(x)), rtol=1e-5, atol=1e-6)
    assert probs.shape == (1, 2, 4, 4)


def test_config_round_trip(rng):
    assert_config_round_trip(EncoderBlock(2, 16, dropout_rate=0.1, attention_dropout_rate=0.1,
                                          stochastic_depth_rate=0.1),
                             rng.normal(size=(2, 3, 8)).astype("float32"))


def _largest(arrays):
    return max(1.0, max(float(np.max(np.abs(np.asarray(a)))) for a in arrays))


def _block_gradients(block, x, jit_compile):
    import tensorflow as tf

    @tf.function(jit_compile=jit_compile, autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = block(x, training=True)
            loss = tf.reduce_sum(y * tf.sin(y))
        return y, tape.gradient(loss, [x] + block.trainable_variables)

    return step(tf.constant(x))


def _twin_blocks(rng, shape):
    """Two blocks with the same perturbed weights and random seeds, one rematerialised."""
    blocks = []
    for rematerialize in (False, True):
        block = EncoderBlock(num_heads=4, mlp_dim=64, dropout_rate=0.2, attention_dropout_rate=0.3,
                             stochastic_depth_rate=0.4)
        block.build(shape)
        for i, generator in enumerate(block.seed_generators):  # the same seeds in both twins
            generator.state.assign(np.array([1000 + i, 7], generator.state.dtype))
        blocks.append(block)
    randomise(blocks[0], rng)
    blocks[1].set_weights(blocks[0].get_weights())
    blocks[1].rematerialize = True
    return blocks


@pytest.mark.slow
def test_rematerialised_block_has_the_same_outputs_and_gradients_with_dropout(rng):
    # Dropout, attention dropout and stochastic depth all on: the recomputed
    # forward pass must draw the same masks, or the gradients would differ.
    x = rng.normal(size=(4, 9, 32)).astype("float32")
    # (Under XLA, the trainer's default, test_training_loop's remat test trains both ways.)
    for jit_compile in (False,):
        plain, remat = _twin_blocks(rng, x.shape)
        for _ in range(2):  # the second step draws fresh masks in both
            (y0, g0), (y1, g1) = _block_gradients(plain, x, jit_compile), _block_gradients(remat, x, jit_compile)
            np.testing.assert_allclose(np.asarray(y1), np.asarray(y0), rtol=1e-6, atol=1e-6)
            assert len(g0) == len(g1) == 1 + len(plain.trainable_variables)
            scale = _largest(g0)  # summation orders differ: tolerance relative to the largest gradient
            for a, b in zip(g0, g1):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5 * scale)
        states = lambda block: [np.asarray(g.state) for g in held_seed_generators(block)]  # noqa: E731
        assert len(states(plain)) == 4
        for a, b in zip(states(plain), states(remat)):  # each state advanced once per step, not twice
            np.testing.assert_array_equal(a, b)


def held_seed_generators(layer, seen=None):
    """Every keras.random.SeedGenerator reachable from `layer`'s attributes, found
    without Keras' layer tracking: the oracle for EncoderBlock.seed_generators."""
    import keras

    seen = set() if seen is None else seen
    found = []
    values = list(vars(layer).values())
    while values:
        value = values.pop(0)
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, keras.random.SeedGenerator):
            found.append(value)
        elif isinstance(value, keras.layers.Layer):
            found.extend(held_seed_generators(value, seen))
        elif isinstance(value, (list, tuple)):
            values.extend(value)
        elif isinstance(value, dict):
            values.extend(value.values())
    return found


@pytest.mark.parametrize("rates", [(0.2, 0.3, 0.4), (0.0, 0.3, 0.0), (0.2, 0.0, 0.4), (0.0, 0.0, 0.0)])
def test_the_block_lists_every_random_state_it_holds(rates):
    # The remat rewind assigns exactly block.seed_generators: one left out would
    # draw a new mask in the backward pass, and the gradients would silently differ.
    dropout, attention_dropout, drop_path = rates
    block = EncoderBlock(num_heads=4, mlp_dim=64, dropout_rate=dropout, attention_dropout_rate=attention_dropout,
                         stochastic_depth_rate=drop_path)
    block.build((2, 9, 32))
    listed, held = block.seed_generators, held_seed_generators(block)
    assert len({id(g) for g in listed}) == len(listed)
    assert {id(g) for g in listed} == {id(g) for g in held}
    # dropout after attention, the MLP's dropout (both dropout_rate), attention dropout, stochastic depth
    assert len(listed) == 2 * (dropout > 0) + (attention_dropout > 0) + 1


def test_rematerialised_block_recomputes_its_forward_pass_for_the_gradient(rng):
    import tensorflow as tf

    x = tf.constant(rng.normal(size=(2, 5, 32)).astype("float32"))
    for rematerialize, forward_passes in ((False, 1), (True, 2)):
        block = EncoderBlock(num_heads=4, mlp_dim=64)
        block.build(x.shape)
        block.rematerialize = rematerialize
        calls = []
        inner = block._residual_branches
        block._residual_branches = lambda *a: calls.append(1) or inner(*a)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(block(x, training=True) ** 2)
        tape.gradient(loss, block.trainable_variables)
        assert len(calls) == forward_passes
        block(x, training=False)  # inference never rematerialises
        assert len(calls) == forward_passes + 1


@pytest.mark.parametrize("gelu_approximate", [True, False])
def test_training_with_the_fused_gelu_equals_the_plain_keras_path(rng, gelu_approximate):
    import tensorflow as tf

    x = tf.constant(rng.normal(size=(2, 9, 32)).astype("float32"))
    block = EncoderBlock(num_heads=4, mlp_dim=64, gelu_approximate=gelu_approximate,
                         relative_position_grid=(2, 4), num_prefix_tokens=1)
    block.build(x.shape)
    randomise(block, rng)
    calls = []
    from keras_vit.layers import fused

    kernel = fused.gelu

    def outputs_and_gradients(fused_gelu):
        block.mlp.fused_gelu = fused_gelu
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = block(x, training=True)
            loss = tf.reduce_sum(y * tf.cos(y))
        return [y] + tape.gradient(loss, [x] + block.trainable_variables)

    fused.gelu = lambda *a, **k: calls.append(1) or kernel(*a, **k)
    try:
        with_fused = outputs_and_gradients(True)
        assert calls == [1]  # the kernel ran
        plain = outputs_and_gradients(False)
        assert calls == [1]
    finally:
        fused.gelu = kernel
    np.testing.assert_allclose(np.asarray(with_fused[0]), np.asarray(block(x, training=False)), rtol=1e-5, atol=1e-5)
    # Summation orders differ: the tolerance is relative to the largest gradient (the key bias's
    # gradient is zero up to rounding: softmax ignores a constant added to a query's logits).
    scale = _largest(plain[1:])
    for a, b in zip(with_fused, plain):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale)
