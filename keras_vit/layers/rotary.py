"""2-D rotary position embedding (RoPE) as DINOv3 applies it: axial, on patch tokens only."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryEmbedding2D(keras.layers.Layer):
    """The rotation angles of every patch of an image's grid: images -> (cos, sin).

    Each patch's centre is placed in [-1, 1] on each axis, normalised by that
    axis's own patch count ((i + 0.5) / rows * 2 - 1), so any size or aspect
    ratio gives coordinates in the same range and nothing is interpolated.
    A head of width d turns in d/4 frequencies per axis, base ** -(4j/d)
    (j = 0 .. d/4 - 1); the angle of frequency f at coordinate c is 2 pi c f.
    The d/2 angles (rows' frequencies, then columns') are repeated once to
    width d, the layout that `rotate` pairs with its half-swap: channel i
    turns with channel i + d/2 (what DINOv3 and transformers' DINOv3ViT do).

    Args:
        head_dim: the attention head width d (a multiple of 4).
        stride: pixels per patch (patch size x ResNet stride).
        base: the frequencies' base (DINOv3's rope_theta, 100).
        pad: the grid of an image padded up to a multiple of the stride
            (dynamic_image_pad); otherwise the image divides evenly.
        shift, jitter, rescale: DINOv3's augmentation of the coordinates in
            training (transformers' pos_embed_shift / _jitter / _rescale), one
            draw per step for the whole batch: add a uniform shift in
            [-shift, shift] per axis, multiply each axis by its own
            log-uniform factor in [1/jitter, jitter], then both by one
            log-uniform factor in [1/rescale, rescale]. None: not done (and
            never at inference).
        seed: the draws' seed (a keras.random.SeedGenerator's).

    `call(images, training)` -> (cos, sin), each (rows * cols, d), float32, rows
    of the grid in row-major order, as the patch tokens are.
    """

    def __init__(self, head_dim, stride, base=100.0, pad=False, shift=None, jitter=None, rescale=None, seed=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.shift, self.jitter, self.rescale = (None if v is None else float(v) for v in (shift, jitter, rescale))
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.augments else None
        if int(head_dim) % 4:
            raise ValueError(f"RotaryEmbedding2D needs a head width divisible by 4, got {head_dim}.")
        self.head_dim = int(head_dim)
        self.stride = int(stride)
        self.base = float(base)
        self.pad = bool(pad)

    def frequencies(self):
        """(d/4,) float32: base ** -(4j / d)."""
        exponents = ops.arange(self.head_dim // 4, dtype="float32") * (4.0 / self.head_dim)
        return ops.power(ops.convert_to_tensor(self.base, "float32"), -exponents)

    def grid(self, images):
        height, width = ops.shape(images)[1], ops.shape(images)[2]
        if self.pad:
            return (height + self.stride - 1) // self.stride, (width + self.stride - 1) // self.stride
        return height // self.stride, width // self.stride

    @property
    def augments(self) -> bool:
        """Whether training moves the coordinates (shift, jitter or rescale set)."""
        return any(v is not None for v in (self.shift, self.jitter, self.rescale))

    def coordinates(self, images, training=False):
        """(rows * cols, 2) float32: each patch's centre (row, column) in [-1, 1], each axis by
        its own count; in training, moved by the augmentation (see the class docstring)."""
        rows, cols = self.grid(images)
        ys = (ops.arange(rows, dtype="float32") + 0.5) / ops.cast(rows, "float32") * 2.0 - 1.0
        xs = (ops.arange(cols, dtype="float32") + 0.5) / ops.cast(cols, "float32") * 2.0 - 1.0
        ones = ops.ones((rows, cols), dtype="float32")
        coords = ops.stack([ops.reshape(ys[:, None] * ones, (-1,)), ops.reshape(xs[None, :] * ones, (-1,))], axis=-1)
        return self._augmented(coords) if training and self.augments else coords

    def _augmented(self, coords):
        # transformers' augment_patches_center_coordinates, in its order: shift, jitter, rescale.
        if self.shift is not None:
            coords = coords + keras.random.uniform((1, 2), -self.shift, self.shift, seed=self.seed_generator)
        for spread, shape in ((self.jitter, (1, 2)), (self.rescale, (1, 1))):  # rescale: one factor for both axes
            if spread is not None:
                log = math.log(spread)
                coords = coords * ops.exp(keras.random.uniform(shape, -log, log, seed=self.seed_generator))
        return coords

    def call(self, images, training=False):
        coords = self.coordinates(images, training=training)
        turns = 2.0 * math.pi * self.frequencies()[None, :]  # (1, d/4)
        angles = ops.concatenate([coords[:, :1] * turns, coords[:, 1:] * turns], axis=-1)  # (P, d/2): rows, columns
        angles = ops.concatenate([angles, angles], axis=-1)  # (P, d)
        return ops.cos(angles), ops.sin(angles)

    def compute_output_spec(self, images, training=False):
        # Two tensors, not one twice: a functional graph tells outputs apart by identity.
        return tuple(keras.KerasTensor((None, self.head_dim), dtype="float32") for _ in range(2))

    def get_config(self):
        config = {**super().get_config(), "head_dim": self.head_dim, "stride": self.stride, "base": self.base,
                  "pad": self.pad}
        if self.augments:  # older files lack the keys: they had no augmentation
            config.update(shift=self.shift, jitter=self.jitter, rescale=self.rescale, seed=self.seed)
        return config


def rotate(x, cos, sin):
    """x (B, P, heads, d) turned by the angles (P, d): x cos + swap(x) sin, where
    swap(x) = [-x2, x1] for the halves x1, x2 of each head's channels."""
    half = x.shape[-1] // 2
    swapped = ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = ops.cast(cos, x.dtype)[None, :, None, :], ops.cast(sin, x.dtype)[None, :, None, :]
    return x * cos + swapped * sin
