"""Segmentation heads against the classifier on the same backbone (#56, part 7).

    python benchmarks/dense.py [--model S/16] [--sizes 224,512] [--batch 4] [--rounds 3] [--block 2]

For each image size, three models on one ViT backbone (random weights, float32): the classifier
(keras_vit.ViT with its head), the linear head and the DPT head (keras_vit.tasks.SegmentationTask's
PatchGridModel, 21 classes, the ADE-style count). Each is timed serving (a tf.function of the
Task's serving outputs: mask and probabilities at every pixel; the classifier's probabilities)
and training (one step of SGD on the Task's loss; the classifier's cross-entropy), the contenders
alternating in rounds of the same run with the 2048^2 matmul probe between rounds. Writes
benchmarks/results_dense.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

CLASSES = 21


def contenders(model_name: str, size: int, batch: int) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_vit.tasks import ModelPlan, SegmentationTask
    from keras_vit.tasks.classification import ClassificationTask
    from keras_vit.variants import get_variant

    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(-1, 1, (batch, size, size, 3)).astype(np.float32))
    labels = tf.constant(rng.integers(0, CLASSES, batch).astype(np.int32))
    masks = tf.constant(rng.integers(0, CLASSES, (batch, size, size)).astype(np.int32))
    plan = ModelPlan(get_variant(model_name), (size, size), CLASSES, 3)
    out = {}
    classifier = ClassificationTask()
    cases = [("classifier", classifier, classifier.build_model(plan), {"image": images, "label": labels})]
    for head in ("linear", "dpt"):
        task = SegmentationTask(head=head)
        cases.append((f"{head} head", task, task.build_model(plan), {"image": images, "mask": masks}))
    for name, task, model, batch_dict in cases:
        optimizer = keras.optimizers.SGD(1e-4)
        optimizer.build(model.trainable_variables)

        @tf.function(jit_compile=False)
        def step(data, task=task, model=model, optimizer=optimizer):
            with tf.GradientTape() as tape:
                loss, _ = task.compute_loss(model, data, training=True)
                loss = tf.reduce_mean(loss)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        if name == "classifier":
            serve = tf.function(lambda x, model=model: tf.nn.softmax(model(x, training=False)))
        else:
            serve = tf.function(lambda x, task=task, model=model: task.serving_outputs(model, x))
        out[f"serve {name}"] = lambda serve=serve: tf.nest.map_structure(lambda t: t.numpy(), serve(images))
        out[f"train {name}"] = lambda step=step, data=batch_dict: step(data).numpy()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="S/16")
    parser.add_argument("--sizes", default="224,512")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=float, default=2.0)
    parser.add_argument("--out", default=os.path.join(HERE, "results_dense"))
    args = parser.parse_args(argv)

    import fresh
    from bench_core import MatmulProbe, alternate

    started, rows = time.time(), []
    probe = MatmulProbe(dtypes=("float32",))
    for size in (int(s) for s in args.sizes.split(",")):
        seconds = alternate(contenders(args.model, size, args.batch), args.rounds, args.block, probe)
        for label, times in seconds.items():
            how, name = label.split(" ", 1)
            peer = statistics.median(seconds[f"{how} classifier"])
            row = {"size": size, "how": how, "model": name, "images_per_s": round(args.batch / statistics.median(times), 2),
                   "vs_classifier": round(peer / statistics.median(times), 3)}
            rows.append(row)
            print(f"{size} px {how:5s} {name:10s} {row['images_per_s']:8.2f} images/s  "
                  f"{row['vs_classifier']:.2f}x the classifier", flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": fresh.machine(), "probe": probe.summary(),
              "model": args.model, "batch": args.batch, "rounds": args.rounds, "rows": rows,
              "wall_s": round(time.time() - started, 1)}
    fresh.write_report(args.out, report, markdown)


def markdown(report) -> str:
    import fresh

    lines = [f"{report['model']} backbone, batch {report['batch']}, float32, {fresh.machine_line(report)}.", "",
             "| size | what | model | images/s | vs the classifier |", "|---|---|---|---|---|"]
    for row in report["rows"]:
        lines.append(f"| {row['size']} | {row['how']} | {row['model']} | {row['images_per_s']:.2f} | "
                     f"{row['vs_classifier']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
