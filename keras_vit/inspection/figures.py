"""All inspection figures of a model in one call (what `keras-vit inspect` and the README use)."""

from __future__ import annotations

import os

import numpy as np

from keras_vit.inspection import analysis, attention, plots
from keras_vit.images import to_model_pixels
from keras_vit.inspection.predict import to_probabilities


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
    if num_overlays < 1:
        raise ValueError(f"num_overlays must be at least 1, got {num_overlays}.")
    shown = pixels[:num_overlays]
    prefix = attention.num_prefix_tokens(model)
    # One forward pass per image feeds every figure: the shown images keep
    # their attention and outputs; every image adds to the mean distance.
    distance = analysis.MeanAttentionDistance(model)
    shown_attention, shown_outputs = [], []
    for batch in attention.forward_batches(model, pixels, batch_size=batch_size):
        distance.update(batch["attention"])
        wanted = len(shown) - sum(len(a) for a in shown_attention)
        if wanted > 0:
            shown_attention.append(batch["attention"][:wanted])
            if "logits" in batch:
                shown_outputs.append(batch["logits"][:wanted])
    probabilities = np.concatenate(shown_attention)
    titles = _captions(model, np.concatenate(shown_outputs), labels) if shown_outputs else None
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
    if model.position_embedding is not None:  # "relative" and "none" have no table to compare
        paths["position_similarity"] = plots.plot_position_similarity(
            analysis.position_embedding_similarity(model), os.path.join(out_dir, "position_similarity.png"),
            dpi=dpi)
    paths["attention_distance"] = plots.plot_attention_distance(
        distance.result(), os.path.join(out_dir, "attention_distance.png"),
        uniform=analysis.uniform_attention_distance(model.grid_size, model.config.total_stride), dpi=dpi)
    return paths


def _captions(model, outputs, labels):
    """"pred: <label> (p)" per image, from the model's outputs (B, num_classes)."""
    probabilities = to_probabilities(model, outputs)
    best = np.argmax(probabilities, axis=-1)
    return [f"pred: {labels[i] if labels else i} ({probabilities[n, i]:.2f})" for n, i in enumerate(best)]
