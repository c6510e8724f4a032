"""How far FlexiViT's patch resize moves a ViT's outputs, and what /32 saves.

A /16 checkpoint is loaded at patch 8 and 32 (keras_vit.weights.patch_resize)
and run at the same resolution as /16 on real photos (scikit-image's sample
images). Reported per patch size: the cosine similarity of the logits with
/16's, their relative L2 change, top-1 / top-5 agreement, and the forward
time of one batch. With no pretrained checkpoint on this machine it uses the
initialisation plus noise on every weight (heads included): the numbers then
describe the resize on an untrained network, not on a trained one.

    python benchmarks/patch_resize.py [--variant B/16] [--weights NPZ] [--out results_patch_resize.json]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "cat", "motorcycle_left")


def photos(size):
    import skimage.data as samples

    from keras_vit.images import resize

    out = []
    for name in PHOTOS:
        image = samples.stereo_motorcycle()[0] if name == "motorcycle_left" else getattr(samples, name)()
        out.append(resize(np.asarray(image, np.uint8)[None], (size, size))[0])
    return np.stack(out).astype(np.float32)


def perturbed_checkpoint(variant, path, seed=0):
    import keras_vit
    from keras_vit.weights import save_weights

    model = keras_vit.ViT(variant, image_size=224, num_classes=1000)
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(size=w.shape).astype(np.float32) * 0.02 for w in model.get_weights()])
    return save_weights(model, path)


def timed(model, x, runs=3):
    import tensorflow as tf

    fn = tf.function(lambda t: model(t, training=False))
    fn(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = fn(x).numpy()
        times.append(time.perf_counter() - start)
    return out, float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--weights", help="an official-format /16 .npz (default: perturbed initial weights)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results_patch_resize.json"))
    args = parser.parse_args(argv)

    import keras_vit
    import tensorflow as tf

    weights = args.weights or perturbed_checkpoint(args.variant, os.path.join(tempfile.mkdtemp(), "ckpt.npz"))
    x = tf.constant(keras_vit.preprocess_input(photos(args.image_size)))
    rows = {}
    base = None
    for patch in (16, 8, 32):
        model = keras_vit.from_pretrained(weights, image_size=args.image_size, patch_size=patch)
        logits, seconds = timed(model, x)
        if base is None:
            base = logits
        cosine = np.sum(logits * base, -1) / (np.linalg.norm(logits, axis=-1) * np.linalg.norm(base, axis=-1))
        top5 = [len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) / 5 for a, b in zip(logits, base)]
        rows[patch] = {"grid": list(model.grid_size), "tokens": int(np.prod(model.grid_size)),
                       "cosine_to_16": float(np.mean(cosine)),
                       "relative_l2_change": float(np.mean(np.linalg.norm(logits - base, axis=-1)
                                                           / np.linalg.norm(base, axis=-1))),
                       "top1_agreement": float(np.mean(logits.argmax(-1) == base.argmax(-1))),
                       "top5_overlap": float(np.mean(top5)),
                       "batch_seconds": seconds}
        print(f"/{patch}: {json.dumps(rows[patch])}", flush=True)
    result = {"variant": args.variant, "weights": args.weights or "initialisation + N(0, 0.02) noise (no checkpoint "
              "offline)", "image_size": args.image_size, "photos": list(PHOTOS), "batch": len(PHOTOS),
              "patch_sizes": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
