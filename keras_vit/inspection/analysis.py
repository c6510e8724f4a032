"""The computations behind the paper's Figure 7 (section 4.5), as arrays.

  * `embedding_filter_pca`: principal components of the patch-embedding filters.
  * `position_embedding_similarity`: cosine similarity between position embeddings.
  * `mean_attention_distance`: how far, in pixels, each head looks.
"""

from __future__ import annotations

import numpy as np

from keras_vit.inspection.attention import forward_batches, num_prefix_tokens
from keras_vit.errors import UserError


def embedding_filter_pca(model, num_components=28):
    """Principal components of the patch-embedding filters (Figure 7, left).

    Each of the D filters of the patch projection, a (p, p, C) kernel, is one
    sample. The filters are centred (the mean filter subtracted) and the
    components taken from an SVD.

    Args:
        model: a (non-hybrid) keras_vit ViT; a hybrid's patch embedding
            filters ResNet features, not pixels, so it has no picture.
        num_components: at most min(D, p * p * C) are returned.

    Returns:
        (components (k, p, p, C), explained_variance_ratio (k,)): unit-norm
        components, best first. Their sign is arbitrary, as for any PCA.
    """
    if model.resnet is not None:
        raise UserError("A hybrid model's patch embedding filters ResNet features, not pixels: no RGB filters.")
    kernel = np.asarray(model.patch_embedding.projection.kernel, dtype=np.float64)  # (p, p, C, D)
    p1, p2, channels, width = kernel.shape
    filters = kernel.reshape(p1 * p2 * channels, width).T  # (D, p*p*C): one row per filter
    return pca(filters, num_components, shape=(p1, p2, channels))


def pca(samples, num_components, shape=None):
    """PCA of (n, features) samples via SVD: (components (k, features or *shape), variance ratio (k,))."""
    x = np.asarray(samples, dtype=np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    _, singular, vt = np.linalg.svd(x, full_matrices=False)
    variance = singular ** 2
    total = variance.sum()
    k = min(int(num_components), vt.shape[0])
    ratio = variance[:k] / total if total > 0 else np.zeros(k)
    components = vt[:k]
    if shape is not None:
        components = components.reshape((k,) + tuple(shape))
    return components.astype(np.float32), ratio.astype(np.float32)


def position_embedding_similarity(model):
    """Cosine similarity of every patch's position embedding with every other (Figure 7, centre).

    The class token's embedding is skipped. Every absolute kind of
    position embedding (learned 1-D or 2-D, sin-cos) has a table; a model
    with position_embedding="relative" or "none" has none (ValueError).

    Returns:
        (rows, cols, rows, cols): [i, j] is the map of similarities between
        the embedding of patch (i, j) and that of every patch.
    """
    from keras import ops

    if model.position_embedding is None:
        raise UserError(f"{model.name} has no position embedding table (position_embedding="
                         f"{model.config.position_embedding!r}): position similarity needs an absolute kind.")
    table = np.asarray(ops.convert_to_numpy(model.position_embedding.table()), np.float64)[0]  # (T, D)
    # The table's rows: the positioned prefix (class, distillation token), then the grid.
    return cosine_similarity_grid(table[model.config.num_positioned_prefix_tokens:], model.grid_size)


def cosine_similarity_grid(embeddings, grid_size):
    """(rows * cols, D) row-major patch embeddings -> (rows, cols, rows, cols) cosine similarities."""
    e = np.asarray(embeddings, dtype=np.float64)
    rows, cols = grid_size
    if e.shape[0] != rows * cols:
        raise UserError(f"{e.shape[0]} embeddings for a {rows}x{cols} grid.")
    norms = np.linalg.norm(e, axis=-1, keepdims=True)
    unit = e / np.maximum(norms, 1e-12)
    return (unit @ unit.T).reshape(rows, cols, rows, cols).astype(np.float32)


def patch_distances(grid_size, patch_pixels):
    """(N, N) pixel distances between the centres of every pair of patches (row-major)."""
    rows, cols = grid_size
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    centres = (np.stack([r.ravel(), c.ravel()], axis=-1) + 0.5) * patch_pixels  # (N, 2), (y, x)
    return np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1)


def attention_distance(probabilities, grid_size, patch_pixels, prefix_tokens=1):
    """Mean attention distance in pixels of each image, layer and head.

    For every query patch: the distance to each key patch (between patch
    centres) weighted by the attention it pays that key, then averaged over
    the query patches. The class token is left out as query and as key; the
    remaining weights of each row are renormalised to sum to 1, so the result
    is a true weighted mean over patches.

    Args:
        probabilities: (..., T, T) attention, e.g. (B, layers, heads, T, T).
        grid_size: (rows, cols) of the patch grid.
        patch_pixels: pixels per patch side (patch size times the ResNet
            stride for a hybrid).
        prefix_tokens: tokens before the patches (1 with a class token).

    Returns:
        (...) e.g. (B, layers, heads), in pixels.
    """
    a = np.asarray(probabilities, dtype=np.float64)[..., prefix_tokens:, prefix_tokens:]  # (..., N, N)
    a = a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-12)
    d = patch_distances(grid_size, patch_pixels)
    return (a * d).sum(axis=-1).mean(axis=-1)


def uniform_attention_distance(grid_size, patch_pixels):
    """The mean attention distance of a head that attends to every patch equally (a reference)."""
    return float(patch_distances(grid_size, patch_pixels).mean())


def mean_attention_distance(model, images, batch_size=16):
    """Mean attention distance per layer and head over a set of images (Figure 7, right).

    Args:
        model: a keras_vit ViT.
        images: pixels (B, H, W, C) in 0..255.

    Returns:
        (layers, heads) in pixels of the model's input, averaged over the
        images (batch by batch, so the attention of all images is never held
        at once).
    """
    mean = MeanAttentionDistance(model)
    for batch in forward_batches(model, images, batch_size=batch_size):
        mean.update(batch["attention"])
    return mean.result()


class MeanAttentionDistance:
    """The running mean of `attention_distance` over batches of one model's attention.

    `update(probabilities)` with (b, layers, heads, T, T) arrays (e.g. each
    `forward_batches` batch's "attention"); `result()` -> (layers, heads).
    """

    def __init__(self, model):
        self.grid_size = model.grid_size
        self.patch_pixels = model.config.total_stride
        self.prefix_tokens = num_prefix_tokens(model)
        self.total, self.count = 0.0, 0

    def update(self, probabilities):
        distances = attention_distance(probabilities, self.grid_size, self.patch_pixels, self.prefix_tokens)
        self.total = self.total + distances.sum(axis=0)
        self.count += distances.shape[0]

    def result(self):
        if self.count == 0:
            raise UserError("mean_attention_distance needs at least one image.")
        return (self.total / self.count).astype(np.float32)
