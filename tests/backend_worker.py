"""Run in a fresh process under KERAS_BACKEND=jax or torch by test_backends.py:
loads the checkpoints and .keras files the TensorFlow side wrote, and each
family's transformers directory (keras_vit.from_pretrained at its own size,
resized at load, and as a dynamic model), and writes back what it computed.
One process per backend does both jobs (importing Keras, TensorFlow and the
backend costs 5-12 s a process).

    python backend_worker.py JOB.json FAMILY_JOB.json
"""

import json
import sys

import keras
import numpy as np

import keras_vit


def main(job_path):
    job = json.load(open(job_path))
    results = {"backend": keras.backend.backend()}
    images = np.load(job["images"])
    for case in job["cases"]:
        config = keras_vit.ViTConfig.from_dict(case["config"])
        model = keras_vit.ViT(config, image_size=case["image_size"], num_classes=case["num_classes"],
                              weights=case["npz"])
        results[case["name"] + "/npz"] = keras.ops.convert_to_numpy(model(images[case["name"]])).tolist()
        results[case["name"] + "/count"] = model.count_params()
        restored = keras.models.load_model(case["keras_from_tf"])
        results[case["name"] + "/keras_from_tf"] = keras.ops.convert_to_numpy(
            restored(images[case["name"]])).tolist()
        model.save(case["keras_out"])
    # Fine-tuning the Keras way: a few steps of model.fit on a learnable toy task.
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(64, 16, 16, 3)).astype("float32")
    y = (x[:, :8].mean(axis=(1, 2, 3)) > x[:, 8:].mean(axis=(1, 2, 3))).astype("int32")
    model = keras_vit.ViT(keras_vit.ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2),
                          image_size=16, num_classes=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=16, epochs=8, verbose=0)
    results["fit_loss"] = history.history["loss"]
    # The TensorFlow-only parts refuse to import, naming the fix.
    for module in ("keras_vit.training", "keras_vit.export"):
        try:
            __import__(module)
            results[module] = "imported"
        except ImportError as error:
            results[module] = str(error)
    json.dump(results, open(job["out"], "w"))


def families(job_path):
    """Each family's transformers directory at its own size, resized at load, and as a dynamic model."""
    job = json.load(open(job_path))
    images = np.load(job["images"])
    results = {"backend": keras.backend.backend()}
    for case in job["cases"]:
        if case["name"] == "image_text":
            results.update(image_text(case, images["image_text"]))
            continue
        name, directory, size = case["name"], case["directory"], case["size"]
        native = keras_vit.from_pretrained(directory)
        results[name + "/native"] = keras.ops.convert_to_numpy(native(images[name + "/native"])).tolist()
        resized = keras_vit.from_pretrained(directory, image_size=size)
        results[name + "/resized"] = keras.ops.convert_to_numpy(resized(images[name + "/resized"])).tolist()
        dynamic = keras_vit.from_pretrained(directory, dynamic_image_size=True)
        results[name + "/dynamic"] = keras.ops.convert_to_numpy(dynamic(images[name + "/resized"])).tolist()
        if name + "/padded" in images:  # NaFlex: a batch padded over several grids
            padded = native.call_padded(images[name + "/padded"], images[name + "/grids"])
            results[name + "/padded"] = keras.ops.convert_to_numpy(padded).tolist()
    json.dump(results, open(job["out"], "w"))


def image_text(case, x):
    """Both towers of an image-text folder: what tests/test_image_text.py's reference computes."""
    from tests.test_image_text import LABELS, TEMPLATES, TEXTS

    model = keras_vit.from_pretrained(case["directory"], task="image_text")
    tokens = model.tokenize(TEXTS)
    outputs = dict(token_ids=tokens["token_ids"], token_mask=tokens["token_mask"], text=model.text_embeddings(TEXTS),
                   image=model.image_embeddings(x), logits=model.logits(x, TEXTS),
                   zero_shot=model.zero_shot(x, LABELS, TEMPLATES))
    return {f"image_text/{case['family']}/{key}": np.asarray(value).tolist() for key, value in outputs.items()}


if __name__ == "__main__":
    main(sys.argv[1])
    families(sys.argv[2])
