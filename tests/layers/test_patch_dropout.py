"""PatchDropout: the kept tokens are a random subset of the patches in grid
order plus the prefix; inference sees everything; a ViT trains with it."""

import numpy as np
import pytest

from keras_vit.config import ViTConfig
from keras_vit.errors import UserError
from keras_vit.layers import PatchDropout
from keras_vit.model import ViT


def _tokens(batch=4, prefix=1, patches=16, width=3):
    # Token t of example b holds (b, t, t): recognisable after the gather.
    tokens = np.zeros((batch, prefix + patches, width), np.float32)
    tokens[:, :, 0] = np.arange(batch)[:, None]
    tokens[:, :, 1:] = np.arange(prefix + patches)[None, :, None]
    return tokens


def test_training_keeps_the_prefix_and_a_random_ordered_subset_of_patches():
    layer = PatchDropout(0.75, num_prefix_tokens=1, seed=1)
    out = np.asarray(layer(_tokens(), training=True))
    assert out.shape == (4, 1 + 4, 3)  # 16 patches x 0.25 = 4 kept
    subsets = []
    for b in range(4):
        ids = out[b, :, 1].astype(int)
        assert ids[0] == 0 and (out[b, :, 0] == b).all()  # the class token, this example's own tokens
        assert list(ids[1:]) == sorted(set(ids[1:])) and all(1 <= i <= 16 for i in ids[1:])
        subsets.append(tuple(ids[1:]))
    assert len(set(subsets)) > 1  # a subset per example


def test_inference_keeps_every_token_and_the_config_round_trips():
    layer = PatchDropout(0.5, num_prefix_tokens=0)
    tokens = _tokens(prefix=0)
    np.testing.assert_array_equal(np.asarray(layer(tokens, training=False)), tokens)
    copy = PatchDropout.from_config(layer.get_config())
    assert (copy.rate, copy.num_prefix_tokens) == (0.5, 0)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_a_vit_with_patch_dropout_predicts_as_without_and_trains_on_fewer_tokens(classifier):
    config = ViTConfig(patch_size=7, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, classifier=classifier)
    plain = ViT(config, image_size=(28, 28), num_classes=10, num_channels=1)
    dropped = ViT(config.replace(patch_dropout=0.5), image_size=(28, 28), num_classes=10, num_channels=1)
    dropped.set_weights(plain.get_weights())
    images = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(dropped(images, training=False)), np.asarray(plain(images)), atol=1e-6)
    assert dropped.embed(images, training=True).shape[1] == dropped.num_prefix_tokens + 8  # 16 patches x 0.5
    assert np.asarray(dropped(images, training=True)).shape == (2, 10)
    with pytest.raises(UserError, match="relative"):
        config.replace(patch_dropout=0.5, position_embedding="relative")
