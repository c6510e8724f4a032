"""Run by tests/test_family_backends.py in a fresh process under KERAS_BACKEND=jax or
torch: loads each transformers directory with keras_vit.from_pretrained (at its own
size, resized at load, and as a dynamic model) and writes back the outputs."""

import json
import sys

import keras
import numpy as np

import keras_vit


def main(job_path):
    job = json.load(open(job_path))
    images = np.load(job["images"])
    results = {"backend": keras.backend.backend()}
    for case in job["cases"]:
        name, directory, size = case["name"], case["directory"], case["size"]
        native = keras_vit.from_pretrained(directory)
        results[name + "/native"] = keras.ops.convert_to_numpy(native(images[name + "/native"])).tolist()
        resized = keras_vit.from_pretrained(directory, image_size=size)
        results[name + "/resized"] = keras.ops.convert_to_numpy(resized(images[name + "/resized"])).tolist()
        dynamic = keras_vit.from_pretrained(directory, dynamic_image_size=True)
        results[name + "/dynamic"] = keras.ops.convert_to_numpy(dynamic(images[name + "/resized"])).tolist()
    json.dump(results, open(job["out"], "w"))


if __name__ == "__main__":
    main(sys.argv[1])
