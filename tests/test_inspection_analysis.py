"""Known-answer tests of the inspection computations (numpy only, no model)."""

import itertools
import math

import numpy as np
import pytest

from keras_vit.inspection import (
    attention_distance,
    attention_rollout,
    cosine_similarity_grid,
    patch_distances,
    patch_map,
    pca,
    uniform_attention_distance,
)


def brute_force_mean_distance(rows, cols, patch_pixels, key_weights):
    """Mean over query patches of sum_k w(q, k) * |centre(q) - centre(k)|, with explicit loops."""
    cells = list(itertools.product(range(rows), range(cols)))
    total = 0.0
    for qi, (qr, qc) in enumerate(cells):
        for ki, (kr, kc) in enumerate(cells):
            total += key_weights(qi, ki) * patch_pixels * math.hypot(qr - kr, qc - kc)
    return total / len(cells)


@pytest.mark.parametrize("rows,cols,patch", [(3, 3, 4), (2, 5, 16), (7, 7, 4)])
def test_patch_distances_match_brute_force(rows, cols, patch):
    d = patch_distances((rows, cols), patch)
    cells = list(itertools.product(range(rows), range(cols)))
    for qi, (qr, qc) in enumerate(cells):
        for ki, (kr, kc) in enumerate(cells):
            # centres ((r + 0.5) p, (c + 0.5) p): the half-patch offset cancels.
            assert d[qi, ki] == pytest.approx(patch * math.hypot(qr - kr, qc - kc))


@pytest.mark.parametrize("prefix", [1, 0])
def test_uniform_attention_gives_the_mean_pairwise_distance(prefix):
    rows, cols, patch = 4, 3, 16
    n = rows * cols
    t = n + prefix
    uniform = np.full((2, 3, 5, t, t), 1.0 / t)  # (B, layers, heads, T, T)
    got = attention_distance(uniform, (rows, cols), patch, prefix_tokens=prefix)
    assert got.shape == (2, 3, 5)
    # Without the class token, uniform attention is uniform over the n patches.
    expected = brute_force_mean_distance(rows, cols, patch, lambda q, k: 1.0 / n)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert uniform_attention_distance((rows, cols), patch) == pytest.approx(expected, rel=1e-12)
    # A value worked out by hand for a 1x2 grid of 10-pixel patches: each query
    # pays 1/2 to itself (0 px) and 1/2 to its neighbour (10 px).
    assert attention_distance(np.full((2, 2), 0.5), (1, 2), 10, prefix_tokens=0) == pytest.approx(5.0)


def test_attention_to_self_is_distance_zero_and_to_a_corner_is_known():
    rows, cols, patch = 3, 4, 8
    n = rows * cols
    self_attention = np.eye(n + 1)
    assert attention_distance(self_attention, (rows, cols), patch) == pytest.approx(0.0)
    # Every query looks at patch 0 (top-left), with some weight on the class
    # token that is dropped and renormalised away.
    corner = np.zeros((n + 1, n + 1))
    corner[:, 0] = 0.25
    corner[:, 1] = 0.75
    expected = brute_force_mean_distance(rows, cols, patch, lambda q, k: 1.0 if k == 0 else 0.0)
    assert attention_distance(corner, (rows, cols), patch) == pytest.approx(expected)


def test_rollout_of_identity_attention_is_identity():
    t = 6
    identity = np.broadcast_to(np.eye(t), (2, 4, 3, t, t))  # (B, layers, heads, T, T)
    np.testing.assert_allclose(attention_rollout(identity), np.broadcast_to(np.eye(t), (2, t, t)), atol=1e-7)


def test_rollout_averages_heads_adds_identity_and_multiplies_later_layers_on_the_left():
    # Two tokens; layer 1 heads average to [[0, 1], [1, 0]] (swap), layer 2 is
    # "everyone looks at token 0". Worked by hand:
    #   A1' = ([[0,1],[1,0]] + I) / 2 = [[.5,.5],[.5,.5]]
    #   A2' = ([[1,0],[1,0]] + I) / rowsum = [[1,0],[.5,.5]]
    #   R = A2' A1' = [[.5,.5],[.5,.5]]; the other order A1' A2' = [[.75,.25],[.75,.25]].
    layer1 = np.array([[[0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]])
    layer2 = np.array([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]])
    got = attention_rollout(np.stack([layer1, layer2]))  # (layers=2, heads=2, 2, 2)
    np.testing.assert_allclose(got, [[0.5, 0.5], [0.5, 0.5]], atol=1e-7)
    got = attention_rollout(np.stack([layer2, layer1]))
    np.testing.assert_allclose(got, [[0.75, 0.25], [0.75, 0.25]], atol=1e-7)
    # Heads are averaged before anything else: [[1,0],[1,0]] and [[0,1],[0,1]] -> uniform.
    mixed = np.array([[[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]]])
    np.testing.assert_allclose(attention_rollout(mixed), [[0.75, 0.25], [0.25, 0.75]], atol=1e-7)


def test_rollout_rows_are_distributions():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 2, 10, 10))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    rollout = attention_rollout(probs)
    assert rollout.shape == (3, 10, 10)
    assert (rollout >= 0).all()
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-6)


def test_patch_map_reads_the_class_token_row_or_the_mean_row():
    rows, cols = 2, 3
    m = np.arange(49, dtype=float).reshape(7, 7)  # a class token + 6 patches
    np.testing.assert_array_equal(patch_map(m, (rows, cols), 1), [[1, 2, 3], [4, 5, 6]])
    gap = np.arange(36, dtype=float).reshape(6, 6)  # 6 patches, no class token
    np.testing.assert_allclose(patch_map(gap, (rows, cols), 0), gap.mean(0).reshape(2, 3))


def test_pca_matches_the_eigenvectors_of_the_covariance():
    rng = np.random.default_rng(1)
    # Anisotropic samples so that the components are well separated.
    x = rng.normal(size=(200, 12)) * np.linspace(3.0, 0.2, 12) @ np.linalg.qr(rng.normal(size=(12, 12)))[0]
    components, ratio = pca(x, 5)
    centred = x - x.mean(0)
    eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / len(x))
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    np.testing.assert_allclose(ratio, eigenvalues[:5] / eigenvalues.sum(), rtol=1e-5)
    for got, want in zip(components, eigenvectors.T[:5]):
        assert abs(float(np.dot(got, want))) == pytest.approx(1.0, abs=1e-5)  # same axis, sign free
    # At most min(samples, features) components exist.
    assert pca(x[:3], 28)[0].shape == (3, 12)


def test_cosine_similarity_grid_of_a_hand_made_embedding():
    e1, e2 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    table = np.stack([e1, e2, e1 + e2 / 2, -3 * e1])  # a 2x2 grid, row-major
    sim = cosine_similarity_grid(table, (2, 2))
    assert sim.shape == (2, 2, 2, 2)
    r = 1 / math.sqrt(2)
    expected = np.array([
        [1, 0, r, -1],
        [0, 1, r, 0],
        [r, r, 1, -r],
        [-1, 0, -r, 1],
    ]).reshape(2, 2, 2, 2)
    np.testing.assert_allclose(sim, expected, atol=1e-6)
