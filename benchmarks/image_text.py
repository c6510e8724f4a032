"""Image and text embeddings of SigLIP B/16 against keras-hub's SigLIP (#55, part 6).

    python benchmarks/image_text.py [--rounds 5] [--block 2] [--image-batch 8] [--text-batch 64]

Both models are SigLIP B/16 at 224 px with a 64-token text tower (vocabulary 32,000, a projection
to 768), random weights, float32, built in this one process: keras_vit's ImageTextModel
(keras_vit.model.image_text) and keras-hub's SigLIPBackbone. Each is timed two ways:

- graph: the tower inside a tf.function (with and without XLA), what a served model runs;
- api: numpy in, numpy out, as a user calls it: keras_vit's image_embeddings / text_embeddings
  against keras-hub's get_vision_embeddings / get_text_embeddings (token ids given to both, so
  the tokenizer is not timed).

The contenders alternate in rounds in the same run (keras_vit_bench's `alternate`), with the
2048^2 float32 matmul probe sampled between rounds, so the ratios are paired against a peer on
the same machine at the same moment. Writes benchmarks/results_image_text.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # run as a script: its sibling modules
    sys.path.insert(0, HERE)

VOCABULARY, POSITIONS, IMAGE_SIZE = 32000, 64, 224


def keras_vit_siglip():
    from keras_vit.config import TextConfig
    from keras_vit.model import ViT
    from keras_vit.model.image_text import ImageTextModel

    tower = ViT("SigLIP-B/16", image_size=IMAGE_SIZE, include_top=False)
    text = TextConfig(vocab_size=VOCABULARY, max_positions=POSITIONS, width=768, num_layers=12, num_heads=12,
                      mlp_dim=3072, projection_size=768, projection_bias=True)
    return ImageTextModel(tower, text, loss="sigmoid", family="SigLIP")


def keras_hub_siglip():
    import keras_hub

    vision = keras_hub.models.SigLIPVisionEncoder(16, 768, 12, 12, 3072, image_shape=(IMAGE_SIZE, IMAGE_SIZE, 3))
    text = keras_hub.models.SigLIPTextEncoder(VOCABULARY, 768, 768, 12, 12, 3072, max_sequence_length=POSITIONS,
                                              projection_dim=768)
    return keras_hub.models.SigLIPBackbone(vision, text)


def runners(image_batch: int, text_batch: int) -> dict:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (image_batch, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
    ids = rng.integers(2, VOCABULARY, (text_batch, POSITIONS)).astype(np.int32)
    ours, hub = keras_vit_siglip(), keras_hub_siglip()
    out = {}
    for xla in (False, True):
        how = "XLA" if xla else "no-XLA"
        ours_image = tf.function(lambda x: ours.image_tower(x, training=False), jit_compile=xla)
        hub_image = tf.function(lambda x: hub.get_vision_embeddings(x), jit_compile=xla)
        ours_text = tf.function(lambda t: ours.text_tower(t, training=False), jit_compile=xla)
        hub_text = tf.function(lambda t: hub.get_text_embeddings(t), jit_compile=xla)
        out[f"images keras-vit graph {how}"] = lambda f=ours_image: f(images).numpy()
        out[f"images keras-hub graph {how}"] = lambda f=hub_image: f(images).numpy()
        out[f"texts keras-vit graph {how}"] = lambda f=ours_text: f(ids).numpy()
        out[f"texts keras-hub graph {how}"] = lambda f=hub_text: f(ids).numpy()
    tokens = {"token_ids": ids, "token_mask": np.ones_like(ids)}
    out["images keras-vit api"] = lambda: ours.image_embeddings(images)
    out["images keras-hub api"] = lambda: np.asarray(hub.get_vision_embeddings(images))
    out["texts keras-vit api"] = lambda: ours.text_embeddings(tokens)
    out["texts keras-hub api"] = lambda: np.asarray(hub.get_text_embeddings(ids))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=float, default=2.0, help="seconds each contender runs per round")
    parser.add_argument("--image-batch", type=int, default=8)
    parser.add_argument("--text-batch", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(HERE, "results_image_text"))
    args = parser.parse_args(argv)

    import fresh
    from bench_core import MatmulProbe, alternate

    started = time.time()
    contenders = runners(args.image_batch, args.text_batch)
    probe = MatmulProbe(dtypes=("float32",))
    seconds = alternate(contenders, args.rounds, args.block, probe)
    rows = []
    for label, times in seconds.items():
        kind, impl, how = label.split(" ", 2)
        batch = args.image_batch if kind == "images" else args.text_batch
        peer = label.replace("keras-vit", "keras-hub")
        row = {"what": kind, "impl": impl, "how": how, "batch": batch,
               "per_s": round(batch / statistics.median(times), 2),
               "vs_keras_hub": (round(statistics.median(seconds[peer]) / statistics.median(times), 3)
                                if impl == "keras-vit" else None)}
        rows.append(row)
        print(f"{label:34s} {row['per_s']:9.2f} {kind}/s" + (f"  {row['vs_keras_hub']:.2f}x keras-hub"
                                                           if row["vs_keras_hub"] else ""), flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": fresh.machine(), "probe": probe.summary(),
              "rounds": args.rounds, "block_s": args.block, "rows": rows,
              "wall_s": round(time.time() - started, 1)}
    fresh.write_report(args.out, report, markdown)


def markdown(report) -> str:
    import fresh

    lines = [f"SigLIP B/16 embeddings, keras_vit against keras-hub, float32, {fresh.machine_line(report)}.", "",
             "| what | how | batch | keras-vit /s | keras-hub /s | keras-vit / keras-hub |", "|---|---|---|---|---|---|"]
    by = {(r["what"], r["impl"], r["how"]): r for r in report["rows"]}
    for (what, impl, how), row in by.items():
        if impl != "keras-vit":
            continue
        peer = by[(what, "keras-hub", how)]
        lines.append(f"| {what} | {how} | {row['batch']} | {row['per_s']:.2f} | {peer['per_s']:.2f} | "
                     f"{row['vs_keras_hub']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
