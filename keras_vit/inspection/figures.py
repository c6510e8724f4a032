"""All inspection figures of a model in one call (what `keras-vit inspect` and the README use)."""

from __future__ import annotations

import os

import numpy as np

from keras_vit.inspection import analysis, attention, plots
from keras_vit.images import to_model_pixels
from keras_vit.inspection.predict import to_probabilities
from keras_vit.errors import UserError


def make_figures(model, images, out_dir, labels=None, num_overlays=4, batch_size=16, dpi=100, paths=None,
                 classes=None):
    """Writes every inspection figure of `model` to `out_dir` as PNG.

    Args:
        model: a keras_vit ViT.
        images: pixels (B, H, W, C) in 0..255 (any size; resized for the model).
        out_dir: created if missing.
        labels: class names for the captions (None: class indices).
        num_overlays: images shown in the rollout figure: drawn round the
            classes when `classes` are known (the first image of each class,
            then the second, ...), else the first ones.
        batch_size: images per forward pass.
        paths: the file each image was read from, or None. The rollout
            figure then shows the chosen images as the files hold them (at
            their own aspect ratio, not squashed to the model's square) and
            captions each with its file name.
        classes: the true class of each image (a name, or None where not
            known), or None: captions say it, and the overlays span the classes.

    Writes (and returns as {name: path}):
        rollout.png              `num_overlays` images (see above), each with its attention
                                 rollout; captions: file, true class, prediction
        attention_heads.png      read-out attention of every layer and head, first image shown
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
        raise UserError("make_figures needs at least one image.")
    if num_overlays < 1:
        raise UserError(f"num_overlays must be at least 1, got {num_overlays}.")
    for name, given in (("paths", paths), ("classes", classes)):
        if given is not None and len(given) != len(pixels):
            raise UserError(f"{len(pixels)} images but {len(given)} {name}.")
    chosen = choose_overlays(len(pixels), num_overlays, classes)
    prefix, class_token = attention.num_prefix_tokens(model), attention.reads_class_token(model)
    # One forward pass per image feeds every figure: the shown images keep
    # their attention and outputs; every image adds to the mean distance.
    distance = analysis.MeanAttentionDistance(model)
    kept_attention, kept_outputs = {}, {}
    start = 0
    for batch in attention.forward_batches(model, pixels, batch_size=batch_size):
        distance.update(batch["attention"])
        for index in chosen:
            if start <= index < start + len(batch["attention"]):
                kept_attention[index] = batch["attention"][index - start]
                if "logits" in batch:
                    kept_outputs[index] = batch["logits"][index - start]
        start += len(batch["attention"])
    probabilities = np.stack([kept_attention[i] for i in chosen])
    titles = (_captions(model, np.stack([kept_outputs[i] for i in chosen]), labels)
              if len(kept_outputs) == len(chosen) else None)
    captions = overlay_captions(chosen, paths, classes)
    shown = [_shown_image(images, pixels, paths, i) for i in chosen]
    paths_written = {}

    rollout = attention.patch_map(attention.attention_rollout(probabilities), model.grid_size, prefix,
                                  class_token)
    paths_written["rollout"] = plots.plot_rollout(shown, rollout, os.path.join(out_dir, "rollout.png"),
                                                  titles=titles, captions=captions, dpi=dpi)
    heads = attention.patch_map(probabilities[0], model.grid_size, prefix, class_token)  # (layers, heads, rows, cols)
    paths_written["attention_heads"] = plots.plot_attention_heads(
        shown[0], heads, os.path.join(out_dir, "attention_heads.png"), dpi=dpi)
    if model.resnet is None:
        components, explained = analysis.embedding_filter_pca(model, 28)
        paths_written["embedding_filters"] = plots.plot_embedding_filters(
            components, os.path.join(out_dir, "embedding_filters.png"), explained=explained, dpi=dpi)
    if model.position_embedding is not None:  # "relative" and "none" have no table to compare
        paths_written["position_similarity"] = plots.plot_position_similarity(
            analysis.position_embedding_similarity(model), os.path.join(out_dir, "position_similarity.png"),
            dpi=dpi)
    paths_written["attention_distance"] = plots.plot_attention_distance(
        distance.result(), os.path.join(out_dir, "attention_distance.png"),
        uniform=analysis.uniform_attention_distance(model.grid_size, model.config.total_stride), dpi=dpi)
    return paths_written


def choose_overlays(num_images, num_overlays, classes=None):
    """Indices of the images a figure shows, at most `num_overlays`.

    With `classes` (one per image; None where unknown), round the classes in
    the order they first appear: the first image of each class, then the
    second of each, ... so that four overlays of a class-sorted folder show
    four classes, not four images of the first. Images of unknown class come
    last. Without classes: the first `num_overlays`.
    """
    count = min(int(num_overlays), int(num_images))
    if classes is None or all(c is None for c in classes):
        return list(range(count))
    groups = {}
    for index, name in enumerate(classes):
        groups.setdefault(name, []).append(index)
    unknown = groups.pop(None, [])
    rounds = max((len(members) for members in groups.values()), default=0)
    order = [members[r] for r in range(rounds) for members in groups.values() if r < len(members)]
    return (order + unknown)[:count]


def overlay_captions(chosen, paths=None, classes=None):
    """"<file name>\ntrue: <class>" for each chosen image (None when neither is known)."""
    if paths is None and (classes is None or all(c is None for c in classes)):
        return None
    captions = []
    for index in chosen:
        lines = []
        if paths is not None:
            lines.append(_short(os.path.basename(str(paths[index]))))
        if classes is not None and classes[index] is not None:
            lines.append(f"true: {_short(str(classes[index]))}")
        captions.append("\n".join(lines) or "input")
    return captions


def _short(text, limit=34):
    """Text that fits a panel's title: the middle elided when longer than `limit`."""
    if len(text) <= limit:
        return text
    keep = (limit - 3) // 2
    return text[:keep] + "..." + text[-(limit - 3 - keep):]


# The longest side of an image as shown in rollout.png (larger photos are scaled down first).
DISPLAY_SIDE = 448


def _shown_image(images, pixels, paths, index):
    """The image to draw for `index`, at its own aspect ratio: the file as
    decoded (scaled down to DISPLAY_SIDE) when its path is known, else the
    image as given (before the model's resize); the model's pixels if neither
    can be had."""
    from keras_vit import images as images_lib

    shown = None
    if paths is not None:
        try:
            shown = images_lib.decode(paths[index], pixels.shape[-1] if pixels.shape[-1] in (1, 3) else 3)
        except Exception:  # noqa: BLE001 - the file went away or changed: show what the model saw
            shown = None
    elif np.ndim(images) in (3, 4):  # (B, H, W[, C]) as given
        shown = np.asarray(images)[index]
    if shown is None:
        return pixels[index]
    height, width = shown.shape[:2]
    scale = DISPLAY_SIDE / max(height, width)
    if scale < 1:
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
        shown = images_lib.resize(shown if shown.ndim == 3 else shown[..., None], size)
    return np.asarray(shown)


def _captions(model, outputs, labels):
    """"pred: <label> (p)" per image, from the model's outputs (B, num_classes)."""
    probabilities = to_probabilities(model, outputs)
    best = np.argmax(probabilities, axis=-1)
    return [f"pred: {labels[i] if labels else i} ({probabilities[n, i]:.2f})" for n, i in enumerate(best)]
