"""Synthetic scenes for segmentation and depth, drawn from one geometry: a textured ground that
recedes to the horizon, and shapes of four classes standing on it at their own distances. A
nearer shape hides what is behind it, a farther one is smaller and fades into the haze, so the
mask and the depth map agree with the picture and neither is readable from one pixel's colour.

    keras-vit scenes DIR --count 400          # DIR/train, DIR/val: images/, masks/, depth/; classes.txt

    image, mask, depth = scene(np.random.default_rng(0), size=96)

Classes (mask ids): 0 ground, 1 disc, 2 square, 3 triangle, 4 ring. Depth is in metres, 1.5 to
12 (the ground from near at the bottom row to far at the horizon; the sky beyond it unknown: 0,
class 0 as ground is not; its mask 255).
"""

from __future__ import annotations

import os
from typing import Tuple

import numpy as np

CLASSES = ("ground", "disc", "square", "triangle", "ring")
IGNORE = 255  # keras_vit.tasks.fields.IGNORE: the sky has no class
NEAR, FAR = 1.5, 12.0  # metres: the ground's bottom row, the horizon
HAZE = np.array([200.0, 205.0, 215.0])
# Each class's base colour; every shape's is jittered around it, so colour alone is a weak cue.
BASE_COLOURS = np.array([[110, 100, 80], [200, 60, 50], [60, 160, 70], [60, 90, 200], [190, 170, 40]], np.float64)


def scene(rng: np.random.Generator, size: int = 96) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One scene -> (image (size, size, 3) uint8, mask (size, size) uint8, depth (size, size) float32 m)."""
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64)
    horizon = size * rng.uniform(0.2, 0.4)
    below = rows > horizon
    # The ground: depth grows as 1 / (height below the horizon), from NEAR at the bottom row.
    depth = np.where(below, NEAR * (size - horizon) / np.maximum(rows - horizon, 1e-3), 0.0)
    depth = np.where(depth > FAR, 0.0, depth)
    ground = below & (depth > 0)
    mask = np.where(ground, 0, IGNORE).astype(np.uint8)
    colour = _texture(rng, rows, cols, BASE_COLOURS[0], scale=depth)
    image = np.where(ground[..., None], colour, HAZE)
    depth = np.where(ground, depth, 0.0)
    for distance in sorted(rng.uniform(NEAR + 0.5, FAR * 0.6, size=rng.integers(2, 6)), reverse=True):
        image, mask, depth = _place(rng, image, mask, depth, distance, horizon, size, rows, cols)
    image = image + rng.normal(0, 4.0, image.shape)  # sensor noise
    return np.clip(image, 0, 255).astype(np.uint8), mask, depth.astype(np.float32)


def _place(rng, image, mask, depth, distance, horizon, size, rows, cols):
    """A shape of a random class standing on the ground at `distance`, over what is behind it."""
    label = int(rng.integers(1, len(CLASSES)))
    foot = horizon + NEAR * (size - horizon) / distance  # the row where the ground is that far
    radius = size * 0.5 / distance * rng.uniform(0.8, 1.3)
    cx, cy = rng.uniform(0, size), foot - radius
    inside = _shape(label, rows - cy, cols - cx, radius, rng.uniform(0, np.pi))
    # Nearer than what is already there (the ground behind its foot, a farther shape): drawn over it.
    shown = inside & ((depth == 0) | (depth > distance))
    tint = BASE_COLOURS[label] + rng.normal(0, 25, 3)
    colour = _texture(rng, rows, cols, tint, scale=np.full(rows.shape, distance))
    image = np.where(shown[..., None], colour, image)
    mask = np.where(shown, label, mask).astype(np.uint8)
    # A slight lean: the top of the shape a little farther than its foot.
    lean = distance * (1 + rng.uniform(-0.05, 0.1) * (foot - rows) / max(radius, 1.0))
    depth = np.where(shown, lean, depth)
    return image, mask, depth


def _shape(label, dy, dx, radius, angle):
    """Pixels inside a disc, square, triangle or ring of `radius` centred at (0, 0) (offsets dy, dx)."""
    if label == 1:
        return dy ** 2 + dx ** 2 <= radius ** 2
    y = dy * np.cos(angle) - dx * np.sin(angle)
    x = dy * np.sin(angle) + dx * np.cos(angle)
    if label == 2:
        return (np.abs(x) <= radius * 0.8) & (np.abs(y) <= radius * 0.8)
    if label == 3:  # an equilateral triangle standing on its base
        return (dy <= radius * 0.6) & (np.abs(dx) * 1.7 <= dy + radius)
    distance = np.sqrt(dy ** 2 + dx ** 2)
    return (distance <= radius) & (distance >= radius * 0.55)


def _texture(rng, rows, cols, tint, scale):
    """A tint under stripes of a random direction and frequency, fading into the haze with distance."""
    angle, frequency = rng.uniform(0, np.pi), rng.uniform(0.15, 0.6)
    stripes = np.sin(frequency * (rows * np.cos(angle) + cols * np.sin(angle)) + rng.uniform(0, 6.3))
    colour = tint[None, None] * (1 + 0.25 * stripes[..., None])
    haze = np.clip(np.asarray(scale) / FAR, 0, 1)[..., None] * 0.6
    return colour * (1 - haze) + HAZE * haze


def write_scenes(folder: str, count: int = 400, size: int = 96, seed: int = 0, val_share: float = 0.2) -> dict:
    """Writes `count` scenes under folder/train and folder/val (images/NAME.png, masks/NAME.png,
    depth/NAME.png in millimetres) and folder/classes.txt -> {"train": n, "val": m}."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    val = int(round(count * val_share))
    for split in ("train", "val"):
        for sub in ("images", "masks", "depth"):
            os.makedirs(os.path.join(folder, split, sub), exist_ok=True)
    for i in range(count):
        image, mask, depth = scene(rng, size)
        split = "val" if i < val else "train"
        name = f"scene_{i:05d}.png"
        Image.fromarray(image).save(os.path.join(folder, split, "images", name))
        Image.fromarray(mask, mode="L").save(os.path.join(folder, split, "masks", name))
        Image.fromarray(np.round(depth * 1000).astype(np.uint16)).save(os.path.join(folder, split, "depth", name))
    with open(os.path.join(folder, "classes.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(CLASSES) + "\n")
    return {"train": count - val, "val": val}
