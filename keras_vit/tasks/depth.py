"""Monocular depth: metres per pixel, from an image and its depth map (`depth:DIR` data, or a
`list:` CSV with a depth column); 0 marks an unknown pixel, and so do pixels an augmentation
brought in.

The head predicts log-depth; the served depth is its exponential (always positive). Losses:

    silog  the scale-invariant log loss of Eigen et al. 2014, per image over its known pixels:
           sqrt(mean(g^2) - 0.85 mean(g)^2), g = log(predicted) - log(true) (BTS, DINOv2)
    l1     mean |predicted - true| in metres

An evaluation sums over every known pixel of the set: AbsRel (mean |p - t| / t), RMSE (metres)
and delta1 (the share of pixels with max(p / t, t / p) < 1.25).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from keras_vit.errors import UserError
from keras_vit.tasks.dense import DenseTask, float32_outputs, resized, save_png
from keras_vit.tasks.fields import DEPTH, IMAGE

DEPTH_LOSSES = ("silog", "l1")
SILOG_VARIANCE_FOCUS = 0.85  # Eigen et al.'s lambda, as BTS and DINOv2's depth heads use it
DELTA = 1.25


def _shade(depth) -> np.ndarray:
    """Depths (H, W) -> uint8 grey, the nearest white and the farthest black (log scale)."""
    span = np.log(np.maximum(depth, 1e-3))
    return np.round(255 * (1 - (span - span.min()) / max(float(span.max() - span.min()), 1e-6))).astype(np.uint8)


class DepthTask(DenseTask):
    name = "depth"
    fields = {"image": IMAGE, "depth": DEPTH}

    def __init__(self, head: str = "linear", freeze_backbone: bool = False, loss: str = "silog"):
        super().__init__(head, freeze_backbone)
        if loss not in DEPTH_LOSSES:
            raise UserError(f"--depth-loss {loss}: choose one of {', '.join(DEPTH_LOSSES)}.")
        self.loss = loss

    @classmethod
    def from_train_config(cls, config):
        task = super().from_train_config(config)
        return cls(task.head, task.freeze_backbone, config.depth_loss)

    @classmethod
    def for_run(cls, settings):
        return cls(settings.get("head", "linear"), settings.get("freeze_backbone", False),
                   settings.get("depth_loss", "silog"))

    def build_model(self, plan):
        return self.dense_model(plan, 1)

    def _log_depth(self, model, images, training):
        return float32_outputs(model, images, training)[..., 0]  # (B, H, W)

    def compute_loss(self, model, batch, training):
        return self._losses(self._log_depth(model, batch["image"], training), batch["depth"])

    def _losses(self, log_predicted, true):
        """(each image's loss (B,), {"abs_rel": each image's AbsRel (B,)}) of a log-depth prediction."""
        true = tf.cast(true, tf.float32)
        known = tf.cast(true > 0, tf.float32)
        count = tf.maximum(tf.reduce_sum(known, [1, 2]), 1.0)
        if self.loss == "silog":
            gap = (log_predicted - tf.math.log(tf.maximum(true, 1e-6))) * known
            mean, mean_square = tf.reduce_sum(gap, [1, 2]) / count, tf.reduce_sum(gap * gap, [1, 2]) / count
            loss = tf.sqrt(tf.maximum(mean_square - SILOG_VARIANCE_FOCUS * mean * mean, 0.0) + 1e-8)
        else:
            loss = tf.reduce_sum(tf.abs(tf.exp(log_predicted) - true) * known, [1, 2]) / count
        predicted = tf.exp(log_predicted)
        abs_rel = tf.reduce_sum(tf.abs(predicted - true) / tf.maximum(true, 1e-6) * known, [1, 2]) / count
        return loss, {"abs_rel": abs_rel}

    def weighted_sums(self, model, batch):
        log_predicted = self._log_depth(model, batch["image"], False)  # one forward pass for loss and figures
        loss, _ = self._losses(log_predicted, batch["depth"])
        predicted = tf.exp(log_predicted)
        true = tf.cast(batch["depth"], tf.float32)
        weight = tf.cast(batch["weight"], tf.float32)
        known = tf.cast(true > 0, tf.float32) * weight[:, None, None]
        safe = tf.maximum(true, 1e-6)
        ratio = tf.maximum(predicted / safe, safe / tf.maximum(predicted, 1e-12))
        return {"loss": tf.reduce_sum(loss * weight), "count": tf.reduce_sum(weight), "pixels": tf.reduce_sum(known),
                "abs_rel": tf.reduce_sum(tf.abs(predicted - true) / safe * known),
                "squared_error": tf.reduce_sum(tf.square(predicted - true) * known),
                "delta1": tf.reduce_sum(tf.cast(ratio < DELTA, tf.float32) * known)}

    def summarize(self, sums):
        count, pixels = sums.get("count", 0.0), max(sums.get("pixels", 0.0), 1e-9)
        return {"num_examples": int(count), "loss": sums["loss"] / max(count, 1e-9),
                "abs_rel": sums["abs_rel"] / pixels, "rmse": math.sqrt(sums["squared_error"] / pixels),
                "delta1": sums["delta1"] / pixels}

    def serving_outputs(self, model, images):
        return {"depth": tf.exp(self._log_depth(model, images, False))}

    padding = {"depth": 0.0}

    def at_size(self, outputs, height, width):
        return {"depth": resized(outputs["depth"], height, width)}

    def write_outputs(self, outputs, stem, height, width):
        """stem_depth.png: a 16-bit PNG in millimetres (what depth: data reads back), and
        stem_depth_colour.png: near bright, far dark, for the eye."""
        depth = self.at_size(outputs, height, width)["depth"].numpy()
        millimetres = np.clip(np.round(depth * 1000), 1, 65535).astype(np.uint16)
        return [save_png(f"{stem}_depth.png", millimetres), save_png(f"{stem}_depth_colour.png", _shade(depth))]

    def figure_panels(self, pixels, outputs) -> list:
        """[(title, RGB)] of one image for `keras-vit inspect`: its depth, near bright."""
        shade = _shade(np.asarray(outputs["depth"]))
        return [("depth (near bright)", np.repeat(shade[..., None], 3, -1))]

    def describe_outputs(self, outputs):
        depth = np.asarray(outputs["depth"])
        return (f"depth {depth.shape[1]}x{depth.shape[0]} ({depth.min():.3g} to {depth.max():.3g} m, "
                f"median {np.median(depth):.3g} m)")

    def describe(self, figures):
        return (f"AbsRel {figures['abs_rel']:.4f}, RMSE {figures['rmse']:.4f} m, delta1 {figures['delta1']:.2%}, "
                f"loss {figures['loss']:.4f}")
