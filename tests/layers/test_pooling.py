import numpy as np
import pytest

from keras_vit.layers import TokenPooling
from tests.layers.helpers import assert_config_round_trip


def test_token_and_gap(rng):
    tokens = rng.normal(size=(2, 5, 4)).astype("float32")
    np.testing.assert_array_equal(np.asarray(TokenPooling("token")(tokens)), tokens[:, 0])
    np.testing.assert_allclose(np.asarray(TokenPooling("gap")(tokens)), tokens.mean(axis=1), rtol=1e-6)


def test_unknown_classifier():
    with pytest.raises(ValueError, match="classifier must be one of"):
        TokenPooling("cls")


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_config_round_trip(rng, classifier):
    assert_config_round_trip(TokenPooling(classifier), rng.normal(size=(2, 5, 4)).astype("float32"))
