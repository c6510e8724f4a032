"""from_pretrained on official .npz files: the architecture from the shapes alone."""

import numpy as np
import pytest

import keras_vit
from tests.conftest import tiny_config, tiny_hybrid_config
from tests.layers import reference
from tests.official_format import official_params, write_npz
from tests.test_checkpoints import checkpoint_server  # noqa: F401  (the loopback checkpoint bucket)


@pytest.mark.parametrize("classifier,representation", [("token", 16), ("gap", None)])
def test_architecture_is_inferred_from_the_shapes(tmp_path, rng, classifier, representation):
    config = tiny_config(classifier=classifier, representation_size=representation, num_heads=2, num_layers=3)
    params = official_params(config, grid=(4, 4), num_classes=7, representation_size=representation, rng=rng)
    model = keras_vit.from_pretrained(write_npz(tmp_path / "c.npz", params))
    assert model.config == config and model.image_size == (16, 16) and model.num_classes == 7
    images = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(model(images)), reference.vit_forward(params, images, config),
                               rtol=1e-4, atol=1e-4)


def test_hybrid_and_overrides(tmp_path, rng):
    config = tiny_hybrid_config()
    params = official_params(config, grid=(2, 2), rng=rng)  # no head: a pre-training file
    path = write_npz(tmp_path / "h.npz", params)
    features = keras_vit.from_pretrained(path)
    assert features.config == config and not features.include_top and features.image_size == (16, 16)
    model = keras_vit.from_pretrained(path, num_classes=4, image_size=32, dropout_rate=0.1)
    assert model.config == config.replace(dropout_rate=0.1) and model.grid_size == (4, 4)
    assert not np.asarray(model.head.kernel).any()


def test_a_family_name_needs_a_variant():
    with pytest.raises(ValueError, match=r"names a family of official checkpoints.*ViT_B16\(weights='imagenet21k'\)"):
        keras_vit.from_pretrained("imagenet21k")


def test_unknown_source_says_what_is_accepted():
    with pytest.raises(ValueError, match="neither an existing file nor a known checkpoint name.*hf:ORG/NAME"):
        keras_vit.from_pretrained("/no/such/checkpoint")


def test_root_only_hybrid_like_r_ti16(tmp_path, rng):
    # R+Ti/16's layout at a tiny size: conv_root + gn_root, no units, patches on the /4 map.
    config = tiny_config(patch_size=2, resnet=keras_vit.ResNetConfig(num_layers=()))
    params = official_params(config, grid=(2, 2), num_classes=3, rng=rng)
    assert not any(key.startswith("block") for key in params)
    model = keras_vit.from_pretrained(write_npz(tmp_path / "r.npz", params))
    assert model.config == config and model.image_size == (16, 16)
    by_key = keras_vit.weights.variables_by_key(model)
    assert set(by_key) == set(params)
    for key, value in params.items():
        np.testing.assert_array_equal(np.asarray(by_key[key]), value, err_msg=key)


def test_official_name_and_variant_downloads_and_infers(checkpoint_server, rng):  # noqa: F811
    www, requests = checkpoint_server
    config = keras_vit.get_variant("Ti/16").replace(num_layers=1)  # the file decides: 1 block here
    params = official_params(config, (2, 2), 5, rng=rng)
    (www / "augreg").mkdir()
    write_npz(www / keras_vit.weights.CHECKPOINTS["augreg-imagenet21k"]["Ti/16"], params)
    model = keras_vit.from_pretrained("augreg-imagenet21k:Ti/16")
    assert model.config == config and model.image_size == (32, 32) and model.num_classes == 5
    np.testing.assert_array_equal(np.asarray(model.head.kernel), params["head/kernel"])
    assert len([r for r in requests if r.endswith(".npz")]) == 1
