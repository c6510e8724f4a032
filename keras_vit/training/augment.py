"""Training augmentation, built in one place from the plan's op list, as stateless ops.

    transform = example_transform(plan)      # (image float HWC 0..255, seed) -> model input
    mix = group_mixer(plan)                  # Mixup / CutMix of a group of the stream

The op list (keras_vit.training.plan.augmentation_ops) is ordered: geometry
(Inception crop or resize, then flip / affine / translate), RandAugment, the
scale to what the model takes ([-1, 1], or its pixel normalisation: the op's
"normalization", keras_vit.images.normalize), random erasing (its noise is
N(0, 1) in the model's input space, as timm's after normalisation); mixing
follows, on pairs of the stream (linear, so the same after the scale). Each
op draws from its own seed, folded from the example's seed with the op's
fixed salt (SALTS), so adding an op never changes another's draws.

Every op takes an explicit seed (an int64 pair) and draws with TensorFlow's
stateless random ops only, so an example's augmentation is a function of the
run seed and its position in the stream: the same after a kill -9 and resume,
and the same however many workers and replicas share the stream.

Why not Keras' own layers (keras.layers.RandAugment, MixUp, CutMix,
RandomErasing, Keras 3.15): their random draws go through
`keras.random.*(seed=...)`, which accepts an int or a SeedGenerator (a
variable advanced on every call) and refuses a tensor seed
(tests/test_training_augment.py checks that it still does); RandAugment
ignores the seed it is given altogether. A per-example seed known only inside
the tf.data graph cannot reach them.

- `randaugment(image, num_ops, magnitude, seed)`: RandAugment (Cubuk et al.
  2020) with timm's op list and its "increasing" magnitudes (magnitude 0 is
  the identity for every op that has a magnitude); magnitude m in 0..30 is
  read as m / 10 of the reference strength, as big_vision reads randaug(2, 15).
- `random_erasing(image, probability, seed)`: one box of 2%..1/3 of the area,
  aspect 0.3..3.3, filled with per-pixel normal noise (timm's "pixel" mode).
- `mix_group(batch, ...)`: Mixup / CutMix of a group of 2K consecutive
  examples, example j with example j + K (K the repeated-augmentation count,
  so that copies of one image are not mixed with each other).
"""

from __future__ import annotations

import math

import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.tasks import fields

FILL = 128.0  # the grey that geometric ops leave where no pixel maps (timm's fill)


def fold(seed, salt):
    """A new int64 seed pair from `seed` and a constant salt: one stream per use."""
    return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), salt)


# --- RandAugment ---------------------------------------------------------------------------

def _blend(degenerate, image, factor):
    """PIL's ImageEnhance: degenerate + factor * (image - degenerate), clipped to 0..255."""
    return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 255.0)


def _grey(image):
    """ITU-R 601-2 luma (PIL's "L"), broadcast back to the image's channels."""
    if image.shape[-1] == 1:
        return image
    luma = tf.reduce_sum(image * tf.constant([0.299, 0.587, 0.114]), axis=-1, keepdims=True)
    return tf.broadcast_to(luma, tf.shape(image))


def _affine(image, matrix, fill=FILL, interpolation="BILINEAR"):
    """The output pixel (x, y) takes the input at matrix @ (x, y, 1), with
    (x, y) about the centre; bilinear (a mask: nearest), `fill` outside."""
    height, width = image.shape[0], image.shape[1]
    a, b, c, d, e, f = tf.unstack(matrix)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    transform = tf.stack([a, b, cx + c - a * cx - b * cy, d, e, cy + f - d * cx - e * cy, 0.0, 0.0])
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform[None], output_shape=[height, width], fill_value=fill,
        interpolation=interpolation, fill_mode="CONSTANT")[0]


def _rotation(image, m, sign):
    angle = sign * 30.0 * m * math.pi / 180.0
    cos, sin = tf.cos(angle), tf.sin(angle)
    return tf.stack([cos, -sin, 0.0, sin, cos, 0.0])


def _shear(axis):
    def matrix(image, m, sign):
        s = sign * 0.3 * m
        values = [1.0, s, 0.0, 0.0, 1.0, 0.0] if axis == 0 else [1.0, 0.0, 0.0, s, 1.0, 0.0]
        return tf.stack([tf.cast(v, tf.float32) for v in values])
    return matrix


def _translation(axis):
    def matrix(image, m, sign):
        # Whole pixels, as PIL's translate of timm's TranslateRel.
        side = image.shape[1] if axis == 0 else image.shape[0]
        shift = tf.round(sign * 0.45 * m * side)
        values = [1.0, 0.0, shift, 0.0, 1.0, 0.0] if axis == 0 else [1.0, 0.0, 0.0, 0.0, 1.0, shift]
        return tf.stack([tf.cast(v, tf.float32) for v in values])
    return matrix


# RandAugment's geometric ops, as the matrix each applies: a mask or depth map moves with its image.
MATRICES = {"rotate": _rotation, "shear_x": _shear(0), "shear_y": _shear(1),
            "translate_x": _translation(0), "translate_y": _translation(1)}


def _geometric(name):
    def op(image, m, sign):
        return _affine(image, MATRICES[name](image, m, sign))
    return op


def _enhance(degenerate):
    def op(image, m, sign):
        return _blend(degenerate(image), image, tf.maximum(0.0, 1.0 + sign * 0.9 * m))
    return op


def _sharpen_degenerate(image):
    """PIL's SMOOTH filter (centre 5, others 1, / 13) inside, the border untouched."""
    kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    channels = image.shape[-1]
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, channels, 1])
    smooth = tf.round(tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "VALID")[0])
    return tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]) + image * tf.pad(
        tf.zeros_like(smooth[..., :1]), [[1, 1], [1, 1], [0, 0]], constant_values=1.0)


def _posterize(image, m, sign):
    bits = tf.cast(tf.clip_by_value(8 - tf.cast(4.0 * m, tf.int32), 1, 8), tf.uint8)
    mask = tf.bitwise.left_shift(tf.constant(255, tf.uint8), 8 - bits)
    return tf.cast(tf.bitwise.bitwise_and(tf.cast(tf.round(image), tf.uint8), mask), tf.float32)


def _solarize(image, m, sign):
    threshold = tf.clip_by_value(256.0 - 256.0 * m, 0.0, 256.0)
    return tf.where(image >= threshold, 255.0 - image, image)


def _solarize_add(image, m, sign):
    return tf.where(image < 128.0, tf.minimum(255.0, image + tf.round(110.0 * m)), image)


def _autocontrast(image, m, sign):
    """Each channel stretched to 0..255 (a flat channel is left as it is)."""
    low = tf.reduce_min(image, axis=[0, 1], keepdims=True)
    high = tf.reduce_max(image, axis=[0, 1], keepdims=True)
    scale = tf.where(high > low, 255.0 / tf.maximum(high - low, 1e-6), 1.0)
    offset = tf.where(high > low, low, 0.0)
    return tf.clip_by_value((image - offset) * scale, 0.0, 255.0)


def _equalize_channel(channel):
    """PIL's ImageOps.equalize of one uint8 channel (as float)."""
    values = tf.cast(tf.round(channel), tf.int32)
    histogram = tf.math.bincount(tf.reshape(values, [-1]), minlength=256, maxlength=256)
    last = tf.gather(histogram, tf.reduce_max(tf.where(histogram > 0)))
    step = (tf.reduce_sum(histogram) - last) // 255
    lut = (tf.cumsum(histogram, exclusive=True) + step // 2) // tf.maximum(step, 1)
    lut = tf.clip_by_value(lut, 0, 255)
    return tf.where(step > 0, tf.cast(tf.gather(lut, values), tf.float32), channel)


def _equalize(image, m, sign):
    return tf.stack([_equalize_channel(image[..., c]) for c in range(image.shape[-1])], axis=-1)


def _invert(image, m, sign):
    return 255.0 - image


def _mean_grey(image):
    return tf.fill(tf.shape(image), tf.reduce_mean(_grey(image)[..., 0]))


# timm's RandAugment op list (rand_augment_ops, "increasing" magnitudes).
OPS = {
    "auto_contrast": _autocontrast, "equalize": _equalize, "invert": _invert,
    "posterize": _posterize, "solarize": _solarize, "solarize_add": _solarize_add,
    "color": _enhance(_grey), "contrast": _enhance(_mean_grey), "brightness": _enhance(tf.zeros_like),
    "sharpness": _enhance(_sharpen_degenerate), **{name: _geometric(name) for name in MATRICES},
}


def apply_op(name, image, magnitude, sign):
    """One op at magnitude 0..30 (read as magnitude / 10) with sign +-1."""
    return OPS[name](image, tf.cast(magnitude, tf.float32) / 10.0, tf.cast(sign, tf.float32))


def randaugment(image, num_ops, magnitude, seed, maps=()):
    """`num_ops` ops drawn uniformly (with replacement) from OPS, each with a
    random sign, applied in turn to a float image in 0..255. `maps`: (value
    (H, W, 1), fill) pairs (masks, depth maps) that the geometric ops move
    with the image (nearest, `fill` where pixels come in) and the others
    leave alone; given, -> (image, [maps])."""
    names = sorted(OPS)
    values = [value for value, _ in maps]
    for k in range(num_ops):
        draw = fold(seed, k)
        index = tf.random.stateless_uniform([], draw, 0, len(names), dtype=tf.int32)
        sign = tf.where(tf.random.stateless_uniform([], fold(draw, 1)) < 0.5, -1.0, 1.0)

        def branch(name, image=image, values=values, sign=sign):
            moved = values
            if name in MATRICES:
                m = tf.cast(magnitude, tf.float32) / 10.0
                moved = [_affine(v, MATRICES[name](image, m, sign), fill, "NEAREST")
                         for v, (_, fill) in zip(values, maps)]
            return [apply_op(name, image, magnitude, sign)] + list(moved)

        branches = [lambda name=name: branch(name) for name in names]
        shapes = [t.shape for t in branches[0]()]
        results = tf.switch_case(index, branches)
        for tensor, shape in zip(results, shapes):
            tensor.set_shape(shape)
        image, values = results[0], results[1:]
    return (image, list(values)) if maps else image


# --- random erasing ------------------------------------------------------------------------

ERASING_ATTEMPTS = 10


def erasing_box(height, width, seed):
    """(apply_any, top, left, box_height, box_width): the first of
    ERASING_ATTEMPTS boxes (area 2%..1/3, aspect 0.3..3.3) that fits."""
    u = tf.random.stateless_uniform([4, ERASING_ATTEMPTS], seed)
    area = (0.02 + u[0] * (1 / 3 - 0.02)) * height * width
    aspect = tf.exp(math.log(0.3) + u[1] * (math.log(1 / 0.3) - math.log(0.3)))
    box_h = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
    box_w = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
    fits = (box_h < height) & (box_w < width) & (box_h > 0) & (box_w > 0)
    first = tf.argmax(tf.cast(fits, tf.int32))
    box_h, box_w = box_h[first], box_w[first]
    top = tf.cast(u[2, first] * tf.cast(height - box_h + 1, tf.float32), tf.int32)
    left = tf.cast(u[3, first] * tf.cast(width - box_w + 1, tf.float32), tf.int32)
    return tf.reduce_any(fits), tf.minimum(top, height - box_h), tf.minimum(left, width - box_w), box_h, box_w


def box_mask(height, width, top, left, box_h, box_w):
    """(height, width, 1) float: 1 inside the box."""
    rows = tf.range(height)[:, None]
    cols = tf.range(width)[None, :]
    inside = (rows >= top) & (rows < top + box_h) & (cols >= left) & (cols < left + box_w)
    return tf.cast(inside, tf.float32)[:, :, None]


def random_erasing(image, probability, seed):
    """With `probability`, one box of the (model-range) image replaced by N(0, 1) noise."""
    height, width = image.shape[0], image.shape[1]
    fits, top, left, box_h, box_w = erasing_box(height, width, fold(seed, 0))
    erase = fits & (tf.random.stateless_uniform([], fold(seed, 1)) < probability)
    mask = box_mask(height, width, top, left, box_h, box_w) * tf.cast(erase, tf.float32)
    noise = tf.random.stateless_normal(tf.shape(image), fold(seed, 2))
    return image * (1.0 - mask) + noise * mask


# --- Mixup and CutMix -----------------------------------------------------------------------

def sample_beta(alpha, seed):
    """Beta(alpha, alpha) from two stateless gammas."""
    g = tf.random.stateless_gamma([2], fold(seed, 0), alpha=alpha)
    total = g[0] + g[1]
    return tf.where(total > 0, g[0] / tf.maximum(total, 1e-30), 0.5)


def cutmix_box(height, width, lam, seed):
    """timm's rand_bbox: a box of sides sqrt(1 - lam) x the image's, centred
    at a uniform pixel and clipped; -> (top, left, box_h, box_w)."""
    ratio = tf.sqrt(1.0 - lam)
    cut_h, cut_w = tf.cast(height * ratio, tf.int32), tf.cast(width * ratio, tf.int32)
    u = tf.random.stateless_uniform([2], seed)
    cy, cx = tf.cast(u[0] * height, tf.int32), tf.cast(u[1] * width, tf.int32)
    top, bottom = tf.clip_by_value(cy - cut_h // 2, 0, height), tf.clip_by_value(cy + cut_h // 2, 0, height)
    left, right = tf.clip_by_value(cx - cut_w // 2, 0, width), tf.clip_by_value(cx + cut_w // 2, 0, width)
    return top, left, bottom - top, right - left


def mix_draw(height, width, mixup, cutmix, mix_prob, switch_prob, seed):
    """One group's draw -> (mask (H, W, 1) of the pixels an image keeps, lam =
    the weight of its own label). Mixup: a constant mask lam; CutMix: 0 in the
    box, lam = the area kept (timm's corrected lam); not mixed: 1."""
    u = tf.random.stateless_uniform([2], fold(seed, 0))
    use_cutmix = (u[1] < switch_prob) if mixup > 0 and cutmix > 0 else tf.constant(cutmix > 0)
    mixup_lam = sample_beta(mixup, fold(seed, 1)) if mixup > 0 else tf.constant(1.0)
    if cutmix > 0:
        top, left, box_h, box_w = cutmix_box(height, width, sample_beta(cutmix, fold(seed, 2)), fold(seed, 3))
        cut_mask = 1.0 - box_mask(height, width, top, left, box_h, box_w)
        cut_lam = 1.0 - tf.cast(box_h * box_w, tf.float32) / float(height * width)
    else:
        cut_mask, cut_lam = tf.ones([height, width, 1]), tf.constant(1.0)
    mask = tf.where(use_cutmix, cut_mask, tf.fill([height, width, 1], mixup_lam))
    lam = tf.where(use_cutmix, cut_lam, mixup_lam)
    mixed = u[0] < mix_prob
    return tf.where(mixed, mask, tf.ones_like(mask)), tf.where(mixed, lam, 1.0)


def mix_group(group, partner_offset, mixup, cutmix, mix_prob, switch_prob, seed):
    """A group of 2 x partner_offset examples {"image", "label", "weight"}:
    example j and j + partner_offset (mod the group) are mixed with one draw
    per pair, both ways. Adds "mix_label" (the partner's label) and
    "mix_lambda" (the weight of the example's own label)."""
    images, labels = group["image"], group.get("label")
    height, width = images.shape[1], images.shape[2]
    masks, lams = [], []
    for pair in range(partner_offset):
        mask, lam = mix_draw(height, width, mixup, cutmix, mix_prob, switch_prob, fold(seed, pair))
        masks.append(mask)
        lams.append(lam)
    masks = tf.stack(masks + masks)  # pair p draws for examples p and p + offset
    lams = tf.stack(lams + lams)
    partner = tf.roll(tf.range(2 * partner_offset), -partner_offset, axis=0)
    if "weight" in group:
        # A blank stand-in of an unreadable file (weight 0) is mixed with nothing:
        # its partner keeps its own pixels and label, and it weighs nothing itself.
        both = tf.cast(group["weight"] > 0, tf.float32) * tf.cast(tf.gather(group["weight"], partner) > 0, tf.float32)
        masks = 1.0 - (1.0 - masks) * both[:, None, None, None]
        lams = 1.0 - (1.0 - lams) * both
    partner_images = tf.gather(images, partner)
    out = dict(group)
    out["image"] = images * masks + partner_images * (1.0 - masks)
    if labels is not None:  # a Task without labels (masked patches) mixes the images alone
        out["mix_label"] = tf.gather(labels, partner)
    out["mix_lambda"] = lams
    return out


# --- geometry -------------------------------------------------------------------------------
# Each geometric op draws once from its seed and moves the image and every spatial field of the
# example (keras_vit.tasks.fields: masks and depth maps nearest, pixels brought in
# filled with the field's fill) by the same draw.

def crop_window(image, seed):
    """The Inception crop's window of `image`: (begin, size) for tf.slice, the
    channels whole (size -1), so the same window slices a mask."""
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3), min_object_covered=0.0,
        use_image_if_no_bounding_boxes=True)
    return begin, tf.concat([crop_size[:2], [-1]], axis=0)


def _sliced(value, begin, size):
    crop = tf.slice(value, begin, size)
    crop.set_shape([None, None, value.shape[-1]])  # the slice's size is a tensor: keep the channels known
    return crop


def inception_crop(image, size, seed):
    """The official code's Inception crop: 5%..100% of the area, aspect
    3/4..4/3, resized to `size` as evaluation, predict and export resize
    (bilinear, antialiased: keras_vit.images.resize)."""
    return images_lib.resize(_sliced(image, *crop_window(image, seed)), size)


def affine_matrix(image, seed, max_degrees=15.0, max_scale=0.15, max_shift=0.125):
    """random_affine's transform (output pixel -> input pixel) drawn from `seed`."""
    height, width = image.shape[0], image.shape[1]
    u = tf.random.stateless_uniform([4], seed, -1.0, 1.0)
    angle = u[0] * max_degrees * math.pi / 180.0
    scale = 1.0 + u[1] * max_scale
    tx, ty = u[2] * max_shift * width, u[3] * max_shift * height
    cos, sin = tf.cos(angle) / scale, tf.sin(angle) / scale
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    # The map from output to input pixel: rotate/zoom about the centre, then shift.
    return tf.stack([cos, sin, cx - cos * (cx + tx) - sin * (cy + ty),
                     -sin, cos, cy + sin * (cx + tx) - cos * (cy + ty), 0.0, 0.0])


def _projected(value, transform, interpolation="BILINEAR", fill_mode="NEAREST", fill=0.0):
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=value[None], transforms=transform[None], output_shape=[value.shape[0], value.shape[1]], fill_value=fill,
        interpolation=interpolation, fill_mode=fill_mode)[0]


def random_affine(image, seed, max_degrees=15.0, max_scale=0.15, max_shift=0.125):
    """Rotation, zoom and shift drawn from `seed`; edges extend outwards."""
    return _projected(image, affine_matrix(image, seed, max_degrees, max_scale, max_shift))


def translate_offset(image, seed):
    """(pad, offset): random_translate's mirror padding and crop offset (tf.image.stateless_random_crop's draw)."""
    height, width, channels = image.shape
    pad = max(1, height // 8)
    limit = tf.constant([2 * pad + 1, 2 * pad + 1, 1])
    offset = tf.random.stateless_uniform([3], seed, maxval=tf.int32.max, dtype=tf.int32) % limit
    return pad, offset


def _translated(value, pad, offset):
    height, width, channels = value.shape
    padded = tf.pad(value, [[pad, pad], [pad, pad], [0, 0]], mode="SYMMETRIC")
    return tf.slice(padded, offset, [height, width, channels])


def random_translate(image, seed):
    """Shift by up to 1/8 of the side: mirror-pad, then crop back at random."""
    return _translated(image, *translate_offset(image, seed))


def _flipped(value, flip):
    return tf.cond(flip, lambda: tf.reverse(value, [1]), lambda: value)


# --- the op list ----------------------------------------------------------------------------

# Each op's seed salt: fixed, so that one op's draws never depend on which others run.
SALTS = {"inception_crop": 10, "affine": 10, "translate": 10, "flip": 11, "randaugment": 1,
         "random_erasing": 2}


def _moved(example, kinds, on_image, on_map):
    """`example` with on_image(image) and on_map(value, kind) for each mask or depth map."""
    out = dict(example)
    out["image"] = on_image(example["image"])
    for name, value in example.items():
        if name != "image" and kinds[name].spatial:
            out[name] = on_map(value, kinds[name])
    return out


def _apply(op, example, kinds, size, seed):
    """One op of the plan's list on an example {field: travelling value}."""
    name = op["op"]
    image = example["image"]
    if name == "to_model_range":  # to what the model takes (the plan names any normalisation but [-1, 1])
        return {**example, "image": images_lib.normalize(image, op.get("normalization", "minus_one_to_one"))}
    if name == "resize":
        return _moved(example, kinds, lambda v: images_lib.resize(v, size), lambda v, k: fields.resize_map(v, size, k))
    op_seed = fold(seed, SALTS[name])
    if name == "inception_crop":
        begin, crop = crop_window(image, op_seed)
        return _moved(example, kinds, lambda v: images_lib.resize(_sliced(v, begin, crop), size),
                      lambda v, k: fields.resize_map(_sliced(v, begin, crop), size, k))
    if name == "flip":  # tf.image.stateless_random_flip_left_right's draw
        flip = tf.random.stateless_uniform([], op_seed, 0, 1.0) < 0.5
        return _moved(example, kinds, lambda v: _flipped(v, flip), lambda v, k: _flipped(v, flip))
    if name == "affine":
        transform = affine_matrix(image, op_seed)
        return _moved(example, kinds, lambda v: _projected(v, transform),
                      lambda v, k: _projected(v, transform, "NEAREST", "CONSTANT", k.fill))
    if name == "translate":
        pad, offset = translate_offset(image, op_seed)
        return _moved(example, kinds, lambda v: _translated(v, pad, offset), lambda v, k: _translated(v, pad, offset))
    if name == "randaugment":
        maps = [n for n in example if n != "image" and kinds[n].spatial]
        if not maps:
            return {**example, "image": randaugment(image, op["num_ops"], op["magnitude"], op_seed)}
        image, moved = randaugment(image, op["num_ops"], op["magnitude"], op_seed,
                                   maps=[(example[n], kinds[n].fill) for n in maps])
        return {**example, "image": image, **dict(zip(maps, moved))}
    if name == "random_erasing":
        return {**example, "image": random_erasing(image, op["probability"], op_seed)}
    raise ValueError(f"unknown augmentation op {name!r}")


def fields_transform(plan, ops=None, kinds=None):
    """(example {field: decoded value}, int64 seed pair) -> the example as the
    model takes it: the image (float (H, W, C) 0..255 of any size) through the
    plan's ops (or `ops`) to (plan.image_size, C) in the model's range, every
    mask or depth map moved with it to (plan.image_size) (`kinds`, default
    plan.fields, says each field's kind); other fields as they are."""
    size, channels = tuple(plan.image_size), plan.num_channels
    ops, kinds = plan.augmentation if ops is None else ops, plan.fields if kinds is None else kinds

    def transform(example, seed):
        example = {name: fields.to_travel(name, kinds[name], value) for name, value in example.items()}
        example["image"].set_shape([None, None, channels])
        for op in ops:
            example = _apply(op, example, kinds, size, seed)
        example["image"] = tf.ensure_shape(example["image"], [size[0], size[1], channels])
        return {name: fields.from_travel(kinds[name], value) for name, value in example.items()}

    return transform


def resize_transform(plan, kinds):
    """example {field: decoded value} -> resized to the plan's size (masks and depth maps
    nearest) and scaled as the model takes it, nothing drawn: what evaluation and the few-shot
    probe read."""
    transform = fields_transform(plan, ({"op": "resize"}, {"op": "to_model_range",
                                                           "normalization": plan.pixel_normalization}), kinds)
    no_seed = tf.zeros([2], tf.int64)  # resize and the scale draw nothing

    def resized(example):
        return transform(example, no_seed)

    return resized


def example_transform(plan):
    """(image float (H, W, C) 0..255 of any size, int64 seed pair) -> the
    model's input (plan.image_size, C), scaled as the model takes it, through the plan's ops."""
    transform = fields_transform(plan)

    def image_only(image, seed):
        return transform({"image": image}, seed)["image"]

    return image_only


def group_mixer(plan):
    """A group of 2K examples (stacked) and its int64 seed pair -> the group
    mixed as plan.mixing says; an example whose file failed to decode
    (weight 0) is mixed with nothing, and nothing is mixed with it."""
    mix = plan.mixing

    def mixer(group, seed):
        return mix_group(group, mix["partner_offset"], mix["mixup"], mix["cutmix"], mix["prob"],
                         mix["switch_prob"], seed)

    return mixer
