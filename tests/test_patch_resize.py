"""FlexiViT's patch-size resize (keras_vit.weights.patch_resize): the resize
matrix is TensorFlow's bilinear resize, the resized kernel keeps the token of a
resized patch (exactly when upsampling; for the patches the resize can
represent, and in the least-squares sense, when downsampling), and a
checkpoint loads at another patch size through the constructors and
from_pretrained."""

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.weights import checkpoint_params, save_weights
from keras_vit.weights.patch_resize import patch_resize_matrix, resize_patch_kernel
from tests.conftest import tiny_config


def tokens(patches, kernel):
    """(N, p, p, C) patches . (p, p, C, D) kernel -> (N, D): the conv at stride p, bias left out."""
    return np.einsum("nhwc,hwcd->nd", patches.astype(np.float64), kernel.astype(np.float64))


def resized(patches, size):
    return tf.image.resize(patches, (size, size), method="bilinear", antialias=False).numpy()


@pytest.mark.parametrize("old,new", [(4, 8), (16, 32), (16, 8), (8, 6), (3, 5)])
def test_matrix_is_tensorflows_bilinear_resize(rng, old, new):
    patch = rng.normal(size=(1, old, old, 1)).astype("float32")
    want = resized(patch, new).reshape(-1)
    np.testing.assert_allclose(patch_resize_matrix(old, new) @ patch.reshape(-1), want, atol=1e-5)


@pytest.mark.parametrize("old,new", [(4, 8), (16, 32), (6, 9)])
def test_upsampled_kernel_keeps_every_patchs_token(rng, old, new):
    kernel = rng.normal(size=(old, old, 3, 5)).astype("float32")
    patches = rng.uniform(-1, 1, size=(8, old, old, 3)).astype("float32")
    np.testing.assert_allclose(tokens(resized(patches, new), resize_patch_kernel(kernel, new)),
                               tokens(patches, kernel), atol=2e-4)


def test_downsampled_kernel_keeps_the_patches_the_resize_represents(rng):
    old, new = 16, 8
    kernel = rng.normal(size=(old, old, 3, 5)).astype("float32")
    small = resize_patch_kernel(kernel, new)
    # 16 -> 8 bilinear with half-pixel centres averages 2x2 blocks: block-constant patches are kept exactly.
    blocks = np.repeat(np.repeat(rng.uniform(-1, 1, size=(8, new, new, 3)), 2, axis=1), 2, axis=2)
    np.testing.assert_allclose(tokens(resized(blocks, new), small), tokens(blocks, kernel), atol=2e-4)
    # Any other patch loses its fine detail: not kept, but the kernel is the least-squares one
    # (the normal equations B (B^T w' - w) = 0 hold).
    noise = rng.uniform(-1, 1, size=(8, old, old, 3))
    assert np.abs(tokens(resized(noise, new), small) - tokens(noise, kernel)).max() > 1.0
    B = patch_resize_matrix(old, new)
    flat = lambda k, p: k.reshape(p * p, -1).astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(B @ (B.T @ flat(small, new) - flat(kernel, old)), 0, atol=1e-4)


def test_checkpoint_loads_at_another_patch_size(tmp_path, rng, capsys):
    source = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)  # patch 4: a 4x4 grid
    source.set_weights([rng.normal(size=w.shape).astype("float32") * 0.2 for w in source.get_weights()])
    path = save_weights(source, str(tmp_path / "tiny.npz"))
    bigger = keras_vit.ViT(tiny_config(patch_size=8), image_size=16, num_classes=3, weights=path)
    assert "FlexiViT" in capsys.readouterr().err and bigger.grid_size == (2, 2)
    params = checkpoint_params(bigger)
    np.testing.assert_allclose(params["embedding/kernel"], resize_patch_kernel(
        checkpoint_params(source)["embedding/kernel"], 8), atol=1e-6)
    # One patch through each model's own patch embedding: the token is kept (upsampling, exact).
    patch = rng.uniform(-1, 1, size=(1, 4, 4, 3)).astype("float32")
    np.testing.assert_allclose(bigger.patch_embedding(resized(patch, 8)).numpy(),
                               source.patch_embedding(patch).numpy(), atol=2e-5)
    smaller = keras_vit.from_pretrained(path, patch_size=2)  # 4 -> 2, an 8x8 grid, position table resized
    assert smaller.config.patch_size == 2 and smaller.grid_size == (8, 8)
    assert smaller.position_embedding.pos_embedding.shape == (1, 65, 32)
