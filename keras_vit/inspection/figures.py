"""All inspection figures of a model in one call (what `keras-vit inspect` and the README use)."""

from __future__ import annotations

import os

import numpy as np

from keras_vit.inspection import analysis, attention, plots
from keras_vit.images import to_model_pixels


def make_figures(model, images, out_dir, labels=None, num_overlays=4, batch_size=16, dpi=100):
    """Writes every inspection figure of `model` to `out_dir` as PNG.

    Args:
        model: a keras_vit ViT.
        images: pixels (B, H, W, C) in 0..255 (any size; resized for the model).
        out_dir: created if missing.
        labels: class names for the captions (None: class indices).
        num_overlays: images shown in the rollout figure (the first ones).
        batch_size: images per forward pass.

    Writes (and returns as {name: path}):
        rollout.png              the first `num_overlays` images and their attention rollout
        attention_heads.png      read-out attention of every layer and head, first image
        embedding_filters.png    first 28 principal components of the patch-embedding
                                 filters (not for hybrid models: their filters see ResNet
                                 features, not pixels)
        position_similarity.png  cosine similarity between position embeddings
        attention_distance.png   mean attention distance per head vs depth, over all images
                                 (dashed: the distance of uniform attention)
    """
    os.makedirs(out_dir, exist_ok=True)
    pixels = to_model_pixels(images, model.image_size, model.num_channels)
    if len(pixels) == 0:
        raise ValueError("make_figures needs at least one image.")
    shown = pixels[:num_overlays]
    prefix = attention.num_prefix_tokens(model)
    _, probabilities = attention.encoder_attention(model, shown, batch_size=batch_size)
    titles = _captions(model, shown, labels, batch_size)
    paths = {}

    rollout = attention.patch_map(attention.attention_rollout(probabilities), model.grid_size, prefix)
    paths["rollout"] = plots.plot_rollout(shown, rollout, os.path.join(out_dir, "rollout.png"),
                                          titles=titles, dpi=dpi)
    heads = attention.patch_map(probabilities[0], model.grid_size, prefix)  # (layers, heads, rows, cols)
    paths["attention_heads"] = plots.plot_attention_heads(
        shown[0], heads, os.path.join(out_dir, "attention_heads.png"), dpi=dpi)
    if model.resnet is None:
        components, explained = analysis.embedding_filter_pca(model, 28)
        paths["embedding_filters"] = plots.plot_embedding_filters(
            components, os.path.join(out_dir, "embedding_filters.png"), explained=explained, dpi=dpi)
    paths["position_similarity"] = plots.plot_position_similarity(
        analysis.position_embedding_similarity(model), os.path.join(out_dir, "position_similarity.png"), dpi=dpi)
    distances = analysis.mean_attention_distance(model, pixels, batch_size=batch_size)
    paths["attention_distance"] = plots.plot_attention_distance(
        distances, os.path.join(out_dir, "attention_distance.png"),
        uniform=analysis.uniform_attention_distance(model.grid_size, model.config.total_stride), dpi=dpi)
    return paths


def _captions(model, pixels, labels, batch_size):
    """"pred: <label> (p)" per image, or None for a model without a head."""
    if not model.include_top:
        return None
    from keras_vit.inspection.predict import predict_probabilities

    probabilities = predict_probabilities(model, pixels, batch_size=batch_size)
    best = np.argmax(probabilities, axis=-1)
    return [f"pred: {labels[i] if labels else i} ({probabilities[n, i]:.2f})" for n, i in enumerate(best)]
