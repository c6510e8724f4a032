import numpy as np
import pytest

from keras_vit.layers import PatchEmbedding
from tests.layers.helpers import assert_config_round_trip


def test_matches_explicit_patch_extraction(rng):
    layer = PatchEmbedding(hidden_size=8, patch_size=4)
    images = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    out = np.asarray(layer(images))
    assert out.shape == (2, 6, 8)
    kernel, bias = [np.asarray(w) for w in layer.projection.get_weights()]
    # Independent reference: cut row-major patches, flatten (p, p, C), project.
    expected = []
    for r in range(2):
        for c in range(3):
            patch = images[:, 4 * r:4 * r + 4, 4 * c:4 * c + 4, :].reshape(2, -1)
            expected.append(patch @ kernel.reshape(-1, 8) + bias)
    np.testing.assert_allclose(out, np.stack(expected, axis=1), rtol=1e-5, atol=1e-5)


def test_indivisible_size_is_a_clear_error():
    with pytest.raises(ValueError, match="height 10 is not divisible by the patch size 4"):
        PatchEmbedding(8, 4)(np.zeros((1, 10, 8, 3), "float32"))


def test_config_round_trip(rng):
    assert_config_round_trip(PatchEmbedding(8, 4), rng.normal(size=(1, 8, 8, 3)).astype("float32"))
