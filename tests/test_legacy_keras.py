"""`.keras` files written by keras_vit before the ViT family (#31) still load and
give the outputs they gave then. tests/data/legacy_keras/make_files.py wrote
them with main at c66d9be (token + representation layer, gap features,
relative positions with softmax, a dynamic model taking pixels, a hybrid),
with perturbed weights, and their outputs on fixed inputs."""

import os

import keras
import numpy as np
import pytest

import keras_vit  # noqa: F401  (registers the layers)

DATA = os.path.join(os.path.dirname(__file__), "data", "legacy_keras")
CASES = ("token_repr", "gap_features", "relative", "dynamic_pixels", "hybrid")


@pytest.mark.parametrize("name", CASES)
def test_a_file_from_before_the_family_loads_with_its_outputs(name):
    expected = np.load(os.path.join(DATA, "expected.npz"))
    model = keras.saving.load_model(os.path.join(DATA, f"{name}.keras"))
    out = np.asarray(model(expected[name]))
    assert np.abs(expected[name + "/out"]).max() > 0.05  # real outputs, not a zero head
    np.testing.assert_allclose(out, expected[name + "/out"], atol=1e-5, rtol=0)
    # ...and it is the ViT of today: saved again, its config has the family fields at their defaults.
    assert model.config.num_register_tokens == 0 and model.config.mlp_activation == "gelu"
