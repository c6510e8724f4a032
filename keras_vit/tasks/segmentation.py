"""Semantic segmentation: a class per pixel, from an image and its mask (`masks:DIR` data, or a
`list:` CSV with a mask column).

The loss is each image's mean cross-entropy over its annotated pixels (IGNORE, 255, and the
pixels an augmentation brought in are left out). An evaluation sums one confusion count per
class over the whole set (intersection, predicted and true pixels), so its figures are the
standard ones, not means of per-image scores:

    mean_iou        the mean over classes of |pred & true| / |pred | true|, leaving out a class
                    absent from both the predictions and the truth
    pixel_accuracy  correct pixels / annotated pixels
    iou_K           each class's IoU (where it is present)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_vit.tasks.dense import DenseTask, float32_outputs, resized, save_png
from keras_vit.tasks.fields import IGNORE, IMAGE, MASK


def palette(classes: int) -> np.ndarray:
    """(256, 3) uint8 colours, one per class id, spread around the hue circle (IGNORE: white)."""
    import colorsys

    colours = np.zeros((256, 3), np.uint8)
    for k in range(min(classes, 255)):
        hue, light = (k * 0.618034) % 1.0, 0.45 + 0.15 * (k % 2)
        colours[k] = np.round(np.array(colorsys.hls_to_rgb(hue, light, 0.75)) * 255)
    colours[IGNORE] = 255
    return colours


class SegmentationTask(DenseTask):
    name = "segmentation"
    fields = {"image": IMAGE, "mask": MASK}

    def build_model(self, plan):
        return self.dense_model(plan, int(plan.num_classes))

    def compute_loss(self, model, batch, training):
        loss, accuracy = pixel_cross_entropy(float32_outputs(model, batch["image"], training), batch["mask"])
        return loss, {"pixel_accuracy": accuracy}

    def weighted_sums(self, model, batch):
        logits = float32_outputs(model, batch["image"], False)
        classes = logits.shape[-1]
        mask = tf.cast(batch["mask"], tf.int32)
        weight = tf.cast(batch["weight"], tf.float32)
        known = tf.cast(mask != IGNORE, tf.float32) * weight[:, None, None]  # padding, unreadable examples: 0
        predicted = tf.argmax(logits, -1, output_type=tf.int32)
        pred_onehot = tf.one_hot(predicted, classes) * known[..., None]
        true_onehot = tf.one_hot(tf.where(mask == IGNORE, 0, mask), classes) * known[..., None]
        image_loss, _ = pixel_cross_entropy(logits, mask)
        sums = {"loss": tf.reduce_sum(image_loss * weight), "count": tf.reduce_sum(weight),
                "pixels": tf.reduce_sum(known), "correct": tf.reduce_sum(pred_onehot * true_onehot)}
        intersection = tf.reduce_sum(pred_onehot * true_onehot, [0, 1, 2])
        predicted_count, true_count = tf.reduce_sum(pred_onehot, [0, 1, 2]), tf.reduce_sum(true_onehot, [0, 1, 2])
        for k in range(classes):
            sums[f"intersection_{k}"] = intersection[k]
            sums[f"predicted_{k}"] = predicted_count[k]
            sums[f"true_{k}"] = true_count[k]
        return sums

    def summarize(self, sums):
        count = sums.get("count", 0.0)
        out = {"num_examples": int(count), "loss": sums["loss"] / max(count, 1e-9),
               "pixel_accuracy": sums["correct"] / max(sums["pixels"], 1e-9)}
        ious = class_ious(sums)
        out["mean_iou"] = float(np.mean(list(ious.values()))) if ious else 0.0
        out.update({f"iou_{k}": iou for k, iou in ious.items()})
        return out

    def serving_outputs(self, model, images):
        logits = float32_outputs(model, images, False)
        return {"mask": tf.argmax(logits, -1, output_type=tf.int32), "probabilities": tf.nn.softmax(logits)}

    padding = {"mask": IGNORE, "probabilities": 0.0}

    def at_size(self, outputs, height, width):
        probabilities = resized(outputs["probabilities"], height, width)
        return {"mask": tf.argmax(probabilities, -1, output_type=tf.int32), "probabilities": probabilities}

    def write_outputs(self, outputs, stem, height, width):
        """stem_mask.png (class ids, PNG mode L) and stem_colour.png (a colour per class)."""
        mask = self.at_size(outputs, height, width)["mask"].numpy().astype(np.uint8)
        classes = np.asarray(outputs["probabilities"]).shape[-1]
        return [save_png(f"{stem}_mask.png", mask), save_png(f"{stem}_colour.png", palette(classes)[mask])]

    def figure_panels(self, pixels, outputs) -> list:
        """[(title, RGB)] of one image for `keras-vit inspect`: the classes' colours over it."""
        mask = np.asarray(outputs["mask"])
        colours = palette(np.asarray(outputs["probabilities"]).shape[-1])[mask]
        image = np.asarray(pixels, np.float32)
        image = np.repeat(image, 3, -1) if image.shape[-1] == 1 else image[..., :3]
        return [("classes", colours), ("overlay", np.round(0.5 * image + 0.5 * colours).astype(np.uint8))]

    def describe_classes(self, figures, class_names=None) -> list:
        """A line per class present in the evaluation: its IoU, by its name where the data names it."""
        lines = []
        for key in sorted((k for k in figures if k.startswith("iou_")), key=lambda k: int(k[4:])):
            k = int(key[4:])
            name = class_names[k] if class_names and k < len(class_names) else str(k)
            lines.append(f"  {name:20s} IoU {figures[key]:.2%}")
        return lines

    def describe(self, figures):
        return (f"mIoU {figures['mean_iou']:.2%}, pixel accuracy {figures['pixel_accuracy']:.2%}, "
                f"loss {figures['loss']:.4f}")


def pixel_cross_entropy(logits, mask):
    """(each image's mean cross-entropy over its annotated pixels (B,), its pixel accuracy (B,)) of
    logits (B, H, W, K) against a mask (B, H, W) of class ids, IGNORE left out."""
    mask = tf.cast(mask, tf.int32)
    known = tf.cast(mask != IGNORE, tf.float32)
    per_pixel = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.where(mask == IGNORE, 0, mask), logits)
    count = tf.maximum(tf.reduce_sum(known, axis=[1, 2]), 1.0)
    hits = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == mask, tf.float32) * known
    return tf.reduce_sum(per_pixel * known, axis=[1, 2]) / count, tf.reduce_sum(hits, axis=[1, 2]) / count


def class_ious(sums) -> dict:
    """{class: IoU} from an evaluation's sums, for each class present in the predictions or the truth."""
    out = {}
    k = 0
    while f"intersection_{k}" in sums:
        union = sums[f"predicted_{k}"] + sums[f"true_{k}"] - sums[f"intersection_{k}"]
        if union > 0:
            out[k] = float(sums[f"intersection_{k}"] / union)
        k += 1
    return out
