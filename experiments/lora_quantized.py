"""Transfer by full fine-tuning, LoRA and a linear probe, each then quantised (#39), in miniature.

    python experiments/lora_quantized.py [--quick] [--seeds N] [--out DIR]

Pre-training: the micro ViT (common.micro_model: width 64, 4 blocks, 7 x 7 patches) trained
from scratch on the training digits 0-4 (about 2,000). Transfer, from that run, to the digits
5-9 (their training digits; tested on their held-out test digits):

- full fine-tuning: every weight trains (the finetune recipe: SGD with momentum 0.9);
- LoRA: rank 8 on the query and value projections, and the new head (the same recipe);
- a linear probe: the paper's closed-form least squares on the frozen pre-trained
  embeddings (keras_vit.training.evaluation.fit_least_squares), every training digit.

Each fine-tuned model is then quantised with keras_vit.quantize (int8, int4) and tested on
the same digits; the probe's features come from the quantised pre-trained model. The claim
checked: LoRA recovers most of full fine-tuning's accuracy with under 10% of the weights
training, and int8 keeps each model's accuracy where int4 may cost some.

Writes results.json, results.md (mean ± std over seeds) and plot.png.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, REPO)

from experiments import common  # noqa: E402

NAME = "lora_quantized"
CLAIM = ("LoRA recovers most of full fine-tuning's accuracy training a few percent of the weights; int8 keeps "
         "a model's accuracy, int4 may cost some (#39).")
PRE_STEPS, QUICK_PRE_STEPS = 600, 4
FINE_STEPS, QUICK_FINE_STEPS = 300, 4
LORA_RANK = 8
METHODS = ("full", "lora", "probe")
METHOD_NAMES = {"full": "full fine-tuning", "lora": f"LoRA r={LORA_RANK} (query, value)",
                "probe": "linear probe (frozen)"}
PRECISIONS = ("float32", "int8", "int4")


def split(first: bool):
    """((train images, labels), (test images, labels)) of the digits 0-4 (first) or 5-9, labels 0-4."""
    (train_x, train_y), (test_x, test_y) = common.digits()
    low = 0 if first else 5

    def part(x, y):
        keep = (y >= low) & (y < low + 5)
        return x[keep], (y[keep] - low).astype(np.int32)

    return part(train_x, train_y), part(test_x, test_y)


def fine_tune(pre_workdir, workdir, seed, steps, quick, lora_rank, data):
    from keras_vit.training import TrainConfig, train

    config = TrainConfig.create(
        "finetune", weights=pre_workdir, dataset=None, workdir=workdir, seed=seed, steps=steps,
        image_size=28, warmup_steps=max(1, steps // 10), train_augment="none", num_classes=5, batch_size=128,
        progress=False,
        # float32 whatever the CPU, as the published figures (auto would take bfloat16 on some).
        strategy="default", precision="float32", jit_compile=not quick, checkpoint_every=steps, keep_checkpoints=1,
        log_every=min(50, steps), eval_batch_size=500, lora_rank=lora_rank)
    return train(config, dataset=common.as_datasets(*data))


def accuracy(model, images, labels) -> float:
    from keras_vit import preprocess_input

    logits = np.asarray(model.predict(preprocess_input(images), batch_size=500, verbose=0))
    return float(np.mean(logits.argmax(1) == labels))


def probe_accuracy(model, train, test) -> float:
    import keras

    from keras_vit import preprocess_input
    from keras_vit.training.evaluation import fit_least_squares

    embed = keras.Model(model.inputs, model.head.input)  # the head's input: the pooled embedding
    features = [np.asarray(embed.predict(preprocess_input(x), batch_size=500, verbose=0)) for x, _ in (train, test)]
    weights, bias = fit_least_squares(features[0], train[1], 5)
    return float(np.mean((features[1] @ weights + bias).argmax(1) == test[1]))


def main(argv=None):
    import keras_vit
    from keras_vit.runs import load_model

    args = common.parse_args(NAME, __doc__.splitlines()[0], argv)
    started = time.time()
    pre_steps, fine_steps = (QUICK_PRE_STEPS, QUICK_FINE_STEPS) if args.quick else (PRE_STEPS, FINE_STEPS)
    source, target = split(True), split(False)
    records = []
    for seed in range(args.seeds):
        pre_workdir = os.path.join(args.runs, f"pretrain-seed={seed}")
        common.train_run(pre_workdir, common.micro_model(args.quick, patch_size=7), seed, pre_steps, args.quick,
                         dataset=common.as_datasets(*source), num_classes=5)
        pretrained = load_model(pre_workdir)
        for method in METHODS:
            trainable = None
            if method != "probe":
                results = fine_tune(pre_workdir, os.path.join(args.runs, f"{method}-seed={seed}"), seed, fine_steps,
                                    args.quick, LORA_RANK if method == "lora" else 0, target)
                trainable = results["parameters"]["trainable"] / results["parameters"]["total"]
                model = load_model(os.path.join(args.runs, f"{method}-seed={seed}"))
            for precision in PRECISIONS:
                if method == "probe":
                    base = pretrained if precision == "float32" else keras_vit.quantize(pretrained, precision)
                    score = probe_accuracy(base, *target)
                else:
                    quantized = model if precision == "float32" else keras_vit.quantize(model, precision)
                    score = accuracy(quantized, *target[1])
                records.append({"method": method, "precision": precision, "seed": seed, "accuracy": score,
                                "trainable_fraction": trainable})
                print(f"seed {seed}: {METHOD_NAMES[method]}, {precision}: top-1 {score:.4f}", flush=True)
    rows = common.summarise(records, ("method", "precision"), extra=("trainable_fraction",))
    by = {(r["method"], r["precision"]): r for r in rows}
    columns = [("transfer", lambda m: METHOD_NAMES[m]),
               ("weights trained", lambda m: "-" if by[(m, "float32")]["trainable_fraction"] is None
                else f"{100 * by[(m, 'float32')]['trainable_fraction']:.1f}%")]
    columns += [(precision, (lambda p: lambda m: common.mean_std(by[(m, p)]))(precision)) for precision in PRECISIONS]
    table = common.markdown_table(METHODS, columns)
    settings = {"quick": args.quick, "seeds": args.seeds, "pre_steps": pre_steps, "fine_steps": fine_steps,
                "lora_rank": LORA_RANK, "model": common.model_sizes(common.micro_model(args.quick, patch_size=7)),
                "test_examples": len(target[1][1])}
    notes = (f"Pre-trained {pre_steps} steps on the digits 0-4 ({len(source[0][1])} training digits), then "
             f"{fine_steps} steps of the finetune recipe on the digits 5-9 ({len(target[0][1])}); the probe fits "
             f"on the same {len(target[0][1])} digits.")
    for row in rows:
        row["transfer"] = METHOD_NAMES[row["method"]]
    common.plot_bars(os.path.join(args.out, "plot.png"), rows, "transfer", "precision",
                     "Transfer to the digits 5-9, then quantised")
    return common.write_results(args.out, NAME, CLAIM, settings, rows, records, table, notes, started)


if __name__ == "__main__":
    main()
