"""Pictures of the arrays computed in `attention` and `analysis` (matplotlib, Agg).

Each `plot_*` function takes arrays, writes one PNG and returns its path.
The PNG is exactly figsize * dpi pixels (no tight bounding box), so callers
know its size in advance.
"""

from __future__ import annotations

import math
import os

import numpy as np

from keras_vit import errors


def require_matplotlib():
    """matplotlib, or one line naming the extra that brings it."""
    return errors.require("matplotlib", "plot", "Drawing figures")


def _pyplot():
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path, dpi):
    plt = _pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    plt.close(fig)
    return str(path)


def _display(image):
    """Pixels 0..255 (H, W[, C]) -> what imshow shows as intended (gray or RGB, uint8)."""
    x = np.clip(np.asarray(image, dtype=np.float32), 0, 255).astype(np.uint8)
    if x.ndim == 3 and x.shape[-1] == 1:
        x = x[..., 0]
    if x.ndim == 3 and x.shape[-1] not in (3, 4):
        x = x.mean(axis=-1).astype(np.uint8)
    return x


def _normalise(a):
    a = np.asarray(a, dtype=np.float64)
    low, high = np.nanmin(a), np.nanmax(a)
    return (a - low) / (high - low) if high > low else np.zeros_like(a)


def upsample(heat, size):
    """A (rows, cols) map resized to (height, width) with bilinear interpolation."""
    from PIL import Image

    height, width = size
    resized = Image.fromarray(np.asarray(heat, dtype=np.float32), mode="F").resize(
        (width, height), Image.Resampling.BILINEAR)
    return np.asarray(resized, dtype=np.float32)


def heatmap_overlay(image, heat, alpha=0.5, cmap="jet"):
    """Blends a patch-grid map onto its image: uint8 RGB (H, W, 3).

    The map is min-max normalised, upsampled to the image (bilinear) and
    coloured with `cmap`; alpha is the map's weight.
    """
    matplotlib = require_matplotlib()
    shown = _display(image)
    if shown.ndim == 2:
        shown = np.repeat(shown[..., None], 3, axis=-1)
    shown = shown[..., :3].astype(np.float32) / 255.0
    heat = _normalise(upsample(heat, shown.shape[:2]))
    coloured = matplotlib.colormaps[cmap](heat)[..., :3]
    return np.round(255 * ((1 - alpha) * shown + alpha * coloured)).astype(np.uint8)


def plot_rollout(images, maps, path, titles=None, figsize=None, dpi=100, captions=None):
    """One row per image: the image, then its attention rollout overlaid on it.

    Args:
        images: pixels (B, H, W, C) in 0..255, or a list of (H, W[, C])
            images of any sizes: each is drawn at its own aspect ratio, its
            map stretched over it (the model saw it resized to its square).
        maps: (B, rows, cols) rollout maps (`attention.rollout_maps`).
        titles: optional caption per image over its overlay (e.g. the
            prediction); default "attention rollout".
        captions: optional caption per image over the image itself (e.g.
            its file name and true class; lines split by "\n"); default "input".
        figsize: inches, default (5, 2.5 * B).
    """
    plt = _pyplot()
    n = len(images)
    figsize = figsize or (5.0, 2.5 * n)
    lines = max([1] + [len(str(t).split("\n")) for t in (titles or []) + (captions or [])])
    fig, axes = plt.subplots(n, 2, figsize=figsize, squeeze=False)
    for i in range(n):
        axes[i, 0].imshow(_display(images[i]), cmap="gray", vmin=0, vmax=255)
        axes[i, 0].set_title(captions[i] if captions else "input", fontsize=8)
        axes[i, 1].imshow(heatmap_overlay(images[i], maps[i]))
        axes[i, 1].set_title(titles[i] if titles else "attention rollout", fontsize=8)
        for ax in axes[i]:
            ax.axis("off")
    title_inches = 0.15 + 0.15 * lines  # room above each row for its captions
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - title_inches / figsize[1], wspace=0.05,
                        hspace=title_inches / max(0.1, figsize[1] / n - title_inches))
    return _save(fig, path, dpi)


def plot_panels(rows, path, dpi=100):
    """A row per image of titled RGB panels (its input, then a Task's outputs drawn over it):
    `rows` [[(title, pixels (H, W, 3) uint8), ...], ...]."""
    plt = _pyplot()
    columns = max(len(row) for row in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(2.2 * columns, 2.3 * len(rows)), squeeze=False)
    for i, row in enumerate(rows):
        for j in range(columns):
            axes[i, j].axis("off")
            if j < len(row):
                axes[i, j].imshow(_display(row[j][1]))
                axes[i, j].set_title(row[j][0], fontsize=8)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.92, wspace=0.05, hspace=0.25)
    return _save(fig, path, dpi)


def plot_attention_heads(image, maps, path, figsize=None, dpi=100):
    """A grid of overlays, one row per layer and one column per head.

    Args:
        image: pixels (H, W, C) in 0..255 at the model's size.
        maps: (layers, heads, rows, cols) read-out attention of this image
            (`attention.head_maps(...)[i]`); each panel is normalised alone.
        figsize: inches, default (1.3 * heads + 0.6, 1.3 * layers + 0.4).
    """
    plt = _pyplot()
    layers, heads = maps.shape[:2]
    figsize = figsize or (1.3 * heads + 0.6, 1.3 * layers + 0.4)
    fig, axes = plt.subplots(layers, heads, figsize=figsize, squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            ax.imshow(heatmap_overlay(image, maps[layer, head], alpha=0.6))
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=8)
    fig.subplots_adjust(left=0.6 / figsize[0], right=0.99, bottom=0.01, top=1 - 0.3 / figsize[1],
                        wspace=0.05, hspace=0.05)
    return _save(fig, path, dpi)


def plot_embedding_filters(components, path, columns=7, explained=None, figsize=None, dpi=100):
    """Principal components of the patch-embedding filters as tiles (Figure 7, left).

    Args:
        components: (k, p, p, C) from `analysis.embedding_filter_pca`; each
            tile is min-max scaled on its own; C=3 is shown as RGB, C=1 as
            gray, any other C as the mean over channels.
        explained: optional (k,) explained variance ratios for the captions.
        figsize: inches, default (1.1 * columns, 1.1 * rows + 0.4).
    """
    plt = _pyplot()
    k = len(components)
    rows = max(1, math.ceil(k / columns))
    figsize = figsize or (1.1 * columns, 1.1 * rows + 0.4)
    fig, axes = plt.subplots(rows, columns, figsize=figsize, squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if i >= k:
            continue
        tile = np.asarray(components[i])
        if tile.shape[-1] != 3:
            tile = tile.mean(axis=-1)
        ax.imshow(_normalise(tile), cmap="gray", interpolation="nearest")
        if explained is not None:
            ax.set_title(f"{100 * explained[i]:.1f}%", fontsize=7)
    kind = "RGB embedding filters" if np.shape(components)[-1] == 3 else "Embedding filters"
    fig.suptitle(f"{kind} (first {k} principal components)", fontsize=9)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.45 / figsize[1], wspace=0.1, hspace=0.35)
    return _save(fig, path, dpi)


def plot_position_similarity(similarity, path, figsize=None, dpi=100):
    """Cosine similarity of position embeddings as a grid of small maps (Figure 7, centre).

    Args:
        similarity: (rows, cols, rows, cols) from
            `analysis.position_embedding_similarity`; the small map at
            (i, j) is the similarity of patch (i, j) with every patch.
        figsize: inches, default (6.4, 5.6) scaled to the grid's aspect.
    """
    plt = _pyplot()
    rows, cols = similarity.shape[:2]
    # One mosaic image with a one-cell gap between maps: fast even for 14x14 (196 maps).
    mosaic = np.full((rows * (rows + 1) - 1, cols * (cols + 1) - 1), np.nan)
    for i in range(rows):
        for j in range(cols):
            y, x = i * (rows + 1), j * (cols + 1)
            mosaic[y:y + rows, x:x + cols] = similarity[i, j]
    figsize = figsize or (6.4, 0.8 + 5.0 * rows / cols)
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    shown = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    centre_y = np.arange(rows) * (rows + 1) + (rows - 1) / 2
    centre_x = np.arange(cols) * (cols + 1) + (cols - 1) / 2
    ax.set_yticks(centre_y, [str(i + 1) for i in range(rows)], fontsize=7)
    ax.set_xticks(centre_x, [str(j + 1) for j in range(cols)], fontsize=7)
    ax.set_ylabel("Input patch row")
    ax.set_xlabel("Input patch column")
    ax.set_title("Position embedding similarity", fontsize=10)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(shown, ax=ax, label="Cosine similarity", fraction=0.046, pad=0.03)
    return _save(fig, path, dpi)


def plot_attention_distance(distances, path, uniform=None, figsize=(5.0, 4.0), dpi=100):
    """Mean attention distance of every head against depth (Figure 7, right).

    Args:
        distances: (layers, heads) in pixels, from `analysis.mean_attention_distance`.
        uniform: optional reference drawn as a dashed line, e.g. the distance
            of uniform attention (`analysis.uniform_attention_distance`).
    """
    plt = _pyplot()
    distances = np.asarray(distances)
    layers, heads = distances.shape
    fig, ax = plt.subplots(figsize=figsize)
    depth = np.arange(1, layers + 1)
    colours = plt.get_cmap("tab20" if heads > 10 else "tab10")
    for head in range(heads):
        ax.scatter(depth, distances[:, head], s=14, color=colours(head % colours.N),
                   label=f"Head {head + 1}" if heads <= 16 else None)
    if uniform is not None:
        ax.axhline(uniform, color="gray", linestyle="--", linewidth=1, label="uniform attention")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth)
    ax.set_xlim(0.5, layers + 0.5)
    ax.set_ylim(0, max(1.0, float(distances.max()) * 1.15, (uniform or 0) * 1.15))
    ax.grid(alpha=0.3)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2 if heads > 6 else 1, loc="lower right", frameon=False)
    fig.tight_layout()  # lays out inside the fixed canvas; the PNG size stays figsize * dpi
    return _save(fig, path, dpi)
