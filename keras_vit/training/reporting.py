"""What a training session shows and records on the way: the progress bar,
TensorBoard scalars, evaluation lines, throughput and the few-shot figures."""

from __future__ import annotations

import time
from typing import Optional

import tensorflow as tf

from keras_vit import runs
from keras_vit.model.lora import parameter_counts
from keras_vit.training import data as data_lib
from keras_vit.training.evaluation import extract_features, few_shot_linear_eval

# TensorBoard's scalar format, written with TF alone: tf.summary.scalar needs
# the tensorboard package, which is needed only to view the logs. TF's public
# API exports the SummaryMetadata proto as tf.compat.v1.SummaryMetadata only.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class="DATA_CLASS_SCALAR").SerializeToString()


def write_scalars(writer, step: int, scalars: dict) -> None:
    """{tag: number} at `step` as TensorBoard scalars (float32)."""
    with writer.as_default(step=step):
        for tag, value in scalars.items():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), metadata=_SCALAR_METADATA)


class Throughput:
    """Images per second over the loops after the first (which compiles), to
    the end of the latest loop: what follows it (evaluation, saving) is not
    training time. A session of one loop (a short run) gets that loop's rate,
    compilation included (a lower bound), rather than none."""

    def __init__(self):
        self.start: Optional[float] = None
        self.end: Optional[float] = None
        self.images = 0
        self.first_began: Optional[float] = None
        self.first_images = 0

    def loop_begins(self) -> None:
        if self.first_began is None:
            self.first_began = time.time()

    def loop_done(self, images: int) -> None:
        self.end = time.time()
        if self.start is None:
            self.start, self.first_images = self.end, images
        else:
            self.images += images

    def images_per_sec(self) -> Optional[float]:
        if self.images:
            return self.images / max(1e-9, self.end - self.start)
        if self.first_images and self.first_began is not None:
            return self.first_images / max(1e-9, self.end - self.first_began)
        return None


class Report:
    """The chief's opening lines, progress bar, TensorBoard scalars and
    evaluation lines; silent on other workers. Progress off (--no-progress)
    hides the bar only: what runs and the evaluations are still said."""

    def __init__(self, plan, chief, step, model, source, strategy):
        from tqdm.auto import tqdm

        config = plan.config
        self.chief = chief
        self.task = plan.task
        if chief:
            counts = parameter_counts(model)
            params, total = counts["trainable"], counts["total"]
            counted = f"{params:,} parameters" if params == total else f"{params:,} of {total:,} parameters train"
            # Classes where the Task has them (labels, masks); a depth or image-text run has none.
            classes = f"{plan.num_classes} classes, " if {"label", "mask"} & set(plan.task.fields) else ""
            print(f"keras-vit train: {model.name} ({counted}) at {plan.image_size}, "
                  f"recipe {plan.recipe.name}, {source.name} ({classes}"
                  f"{source.sizes}), {type(strategy).__name__} x{plan.num_replicas}, "
                  f"batch {plan.global_batch} (accum {plan.accum_steps}), {plan.precision}"
                  + (f", resuming at step {step}" if step else ""), flush=True)
            print(f"keras-vit train: plan: {describe(plan)}", flush=True)
            if plan.precision_why:  # --precision auto: which, and why
                print(f"keras-vit train: precision {plan.precision}: {plan.precision_why}", flush=True)
        self.bar = tqdm(total=plan.steps, initial=step, disable=not (chief and config.progress), unit="step",
                        dynamic_ncols=True, mininterval=1.0)
        self.writer = tf.summary.create_file_writer(runs.tensorboard_dir(config.workdir)) if chief else None

    def train(self, step, logs) -> None:
        rate = logs.get("images_per_sec")
        shown = {"acc": f"{logs['accuracy']:.3f}"} if "accuracy" in logs else {}  # a classifier's
        self.bar.set_postfix(loss=f"{logs['loss']:.4f}", **shown, lr=f"{logs['lr']:.2e}",
                             img_s=f"{rate:.0f}" if rate else "-", refresh=False)
        self._scalars(step, {f"train/{k}": v for k, v in logs.items() if v is not None})

    def advance(self, steps) -> None:
        self.bar.update(steps)

    def eval(self, step, result) -> None:
        if self.chief:
            if "accuracy" in result:  # a classifier's top-k (masked patches' too: their colour classes)
                top5 = f"  top-5 {result['top5']:.4f}" if "top5" in result else ""
                line = (f"step {step}: eval top-1 {result['accuracy']:.4f}{top5}  "
                        f"loss {result['loss']:.4f}  ({result['num_examples']} examples)")
            else:  # another Task's figures, in its words
                line = f"step {step}: eval {self.task.describe(result)}  ({result['num_examples']} examples)"
            if self.bar.disable:
                print(line, flush=True)
            else:
                self.bar.write(line)  # above the bar
        self._scalars(step, {f"eval/{k}": v for k, v in result.items() if k != "num_examples"})

    def close(self) -> None:
        """Ends the bar's line and flushes the logs; closing twice is harmless."""
        self.bar.close()
        if self.writer:
            self.writer.flush()

    def _scalars(self, step, scalars) -> None:
        if self.writer is not None:
            write_scalars(self.writer, step, scalars)


def describe(plan) -> str:
    """One line of what the plan resolved to: steps, warmup, learning rate, augmentation."""
    ops = [op["op"] + (f"({op['num_ops']},{op['magnitude']})" if op["op"] == "randaugment" else "")
           + (f"({op['probability']:g})" if op["op"] == "random_erasing" else "")
           for op in plan.augmentation if op["op"] != "to_model_range"]
    if plan.mixing:
        kinds = [f"{k} {plan.mixing[k]:g}" for k in ("mixup", "cutmix") if plan.mixing[k]]
        ops.append("mix(" + ", ".join(kinds) + ")")
    epochs = f" ({plan.steps / plan.steps_per_epoch:.3g} epochs)" if plan.steps_per_epoch else ""
    level = f", aug level {plan.recipe.aug_level}" if plan.recipe.aug_level else ""
    if plan.pixel_normalization != "minus_one_to_one":  # the [-1, 1] of every earlier run goes unsaid
        level += f", pixels normalised as {plan.pixel_normalization}"
    moves = [f"{name} {value:g}" for name, value in (("shift", plan.model.rope_shift), ("jitter", plan.model.rope_jitter),
                                                     ("rescale", plan.model.rope_rescale)) if value is not None]
    if moves:  # DINOv3's augmentation of the rotary coordinates, from its checkpoint's config
        level += f", rotary coordinates augmented ({', '.join(moves)})"
    if plan.model.lora_rank:
        lora = plan.model.lora
        level += f", LoRA rank {lora['rank']} alpha {lora['alpha']:g} on {'/'.join(lora['targets'])} (the rest frozen)"
        if plan.model.quantization:
            level += f" on an {plan.model.quantization} base (QLoRA; model.keras: merged, float)"
    if plan.task.gathers_across_replicas and plan.num_replicas > 1:
        level += ", no XLA (the task's loss gathers every replica's examples)"
    if set(plan.fields) - {"image", "label"}:  # a Task of more fields: which (masks, depth maps move with the image)
        level += f", task {plan.task.name} on {'+'.join(plan.fields)}"
    return (f"{plan.steps} steps{epochs}, warmup {plan.warmup_steps}, peak lr {plan.recipe.peak_learning_rate:.3g}, "
            f"batch {plan.per_replica_batch}/replica (micro {plan.micro_batch}), {' > '.join(ops)}{level}")


def few_shot(feature_model, source, plan, batch_size) -> dict:
    """The few-shot linear evaluation of a feature model: {"Nshot": accuracy}."""
    config = plan.config
    pool = data_lib.plain_dataset(source, plan, source.train_split, batch_size, limit=config.fewshot_pool)
    test = data_lib.plain_dataset(source, plan, source.eval_split, batch_size, limit=None)
    train_x, train_y = extract_features(feature_model, pool)
    test_x, test_y = extract_features(feature_model, test)
    return {f"{k}shot": acc for k, acc in few_shot_linear_eval(
        train_x, train_y, test_x, test_y, shots=config.fewshot_shots, l2_reg=config.fewshot_l2,
        num_classes=source.num_classes, seed=config.seed).items()}
