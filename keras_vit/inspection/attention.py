"""Attention probabilities and attention rollout, read from the model itself.

The probabilities come from `model.forward_stages(x)`: one pass
through the model's own layers and weights (not a second implementation that
could drift from it) that also yields the encoded tokens and the logits, so
a figure set needs the encoder once per image (`forward_batches`).

Which tokens a map shows:
  * classifier="token": the class token's row (what the read-out token
    attends to), over the patch tokens.
  * classifier="gap" (and "map"): the model's output is the mean of the
    patch tokens (a class token, if any, attends but is not read out), so
    the row that matters is the mean of the patch tokens' query rows. Maps
    show that mean row, over the patch tokens.
Prefix tokens (class, DeiT's distillation token, DINOv2's registers:
`num_prefix_tokens`) are never shown: a map covers the patch grid only.
"""

from __future__ import annotations

import numpy as np

from keras_vit.images import model_inputs
from keras_vit.errors import UserError


def num_prefix_tokens(model):
    """Tokens before the patches, as the model says (ViT.num_prefix_tokens):
    the class token, DeiT's distillation token and DINOv2's registers (0 for
    a plain classifier="gap" model)."""
    return model.num_prefix_tokens


def reads_class_token(model) -> bool:
    """Whether the model's read-out is its class token (sequence position 0):
    the row `patch_map` shows. Not for "gap"/"map", whose prefix (registers,
    or a class token that only attends) is not what the output reads."""
    return getattr(model, "class_token", None) is not None and model.config.classifier in ("token", "token_gap")


def embed(model, x):
    """Model inputs -> the token sequence the encoder sees (B, T, D), through the model's layers."""
    return model.embed(x, training=False)


def forward_batches(model, images, batch_size=16):
    """Runs images through the model once, `batch_size` at a time.

    Args:
        model: a keras_vit ViT.
        images: pixels (B, H, W, C) in 0..255 (see `keras_vit.images`).
        batch_size: images per forward pass.

    Yields, per batch, float32 numpy arrays from `model.forward_stages`:
        "tokens" (b, T, D): the encoder's output;
        "attention" (b, layers, heads, T, T): every block's probabilities;
        "logits" (b, num_classes): the model's output (only with a head).
    """
    for start in range(0, len(images), batch_size):
        x = model_inputs(model, images[start:start + batch_size])
        out = model.forward_stages(x, training=False)
        batch = {
            "tokens": np.asarray(out["tokens"], dtype=np.float32),
            "attention": np.stack([np.asarray(s, dtype=np.float32) for s in out["attention"]], axis=1),
        }
        if "logits" in out:
            batch["logits"] = np.asarray(out["logits"], dtype=np.float32)
        yield batch


def encoder_attention(model, images, batch_size=16):
    """Runs images through the model; returns its encoded tokens and every attention map.

    Args:
        model: a keras_vit ViT.
        images: pixels (B, H, W, C) in 0..255 (see `keras_vit.images`).
        batch_size: images per forward pass.

    Returns:
        (tokens (B, T, D), probabilities (B, layers, heads, T, T)), float32
        numpy; T = patches + 1 with a class token. Row q of a map is the
        softmax over keys for query token q, so every row sums to 1.
    """
    batches = list(forward_batches(model, images, batch_size))
    if not batches:
        raise UserError("encoder_attention needs at least one image.")
    return (np.concatenate([b["tokens"] for b in batches]),
            np.concatenate([b["attention"] for b in batches]))


def attention_rollout(probabilities):
    """Attention rollout (Abnar & Zuidema, 2020).

    Per layer: average the heads, add the identity for the residual
    connection, renormalise each row to sum to 1; then multiply through the
    layers, later layers on the left: R = A'_L ... A'_2 A'_1.

    Args:
        probabilities: (..., layers, heads, T, T), e.g. the second output of
            `encoder_attention`.

    Returns:
        (..., T, T): row q says how much each input token flows into output
        token q.
    """
    a = np.asarray(probabilities, dtype=np.float64)
    if a.ndim < 4 or a.shape[-1] != a.shape[-2]:
        raise UserError(f"Expected probabilities (..., layers, heads, T, T), got shape {a.shape}.")
    a = a.mean(axis=-3)  # (..., layers, T, T)
    a = a + np.eye(a.shape[-1])
    a = a / a.sum(axis=-1, keepdims=True)
    rollout = np.broadcast_to(np.eye(a.shape[-1]), a.shape[:-3] + a.shape[-2:]).copy()
    for layer in range(a.shape[-3]):
        rollout = a[..., layer, :, :] @ rollout
    return rollout.astype(np.float32)


def patch_map(matrix, grid_size, prefix_tokens, class_token=None):
    """The read-out row of a (..., T, T) attention or rollout matrix as a patch grid.

    With a class token (`class_token`; default: any prefix token) that is
    row 0; without one (GAP) the mean of the patch tokens' rows (all rows
    without a prefix), since the pooled output is their mean. Returns
    (..., rows, cols) over the patch tokens (the prefix tokens' columns
    dropped, not renormalised).
    """
    m = np.asarray(matrix)
    if class_token is None:
        class_token = bool(prefix_tokens)
    row = m[..., 0, :] if class_token else m[..., prefix_tokens:, :].mean(axis=-2)  # (..., T)
    rows, cols = grid_size
    return row[..., prefix_tokens:].reshape(row.shape[:-1] + (rows, cols))


def rollout_maps(model, images, batch_size=16):
    """Attention rollout of each image as a patch grid (B, rows, cols); see `patch_map`."""
    _, probabilities = encoder_attention(model, images, batch_size=batch_size)
    return patch_map(attention_rollout(probabilities), model.grid_size, num_prefix_tokens(model),
                     reads_class_token(model))


def head_maps(model, images, batch_size=16):
    """Per-layer, per-head read-out attention as patch grids (B, layers, heads, rows, cols)."""
    _, probabilities = encoder_attention(model, images, batch_size=batch_size)
    return patch_map(probabilities, model.grid_size, num_prefix_tokens(model), reads_class_token(model))
