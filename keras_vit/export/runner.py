"""Runs one exported artifact on a batch of images, in a process of its own.

    python runner.py FORMAT ARTIFACT IMAGES.npy OUT.npz [LATENCY_RUNS]

The validator starts this file by path (not `-m keras_vit.export.runner`), so
the TFLite and ONNX runs import only their runtime, never TensorFlow or
keras_vit: what loads here is what a deployment would load. IMAGES.npy holds
float32 (N, H, W, C) pixels 0..255; OUT.npz receives `probabilities` (N,
classes), `latency_ms` (median of single-image calls) and, for a SavedModel,
the outputs of the encoded-bytes signature on the same images as PNG.
"""

import sys
import time

import numpy as np


def _median_latency_ms(predict_one, image, runs):
    for _ in range(3):  # warm-up: first calls allocate and compile.
        predict_one(image)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        predict_one(image)
        times.append(time.perf_counter() - start)
    return 1000.0 * float(np.median(times))


def run_saved_model(path, images, runs):
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    outputs = serve(images=tf.constant(images))
    result = {name: value.numpy() for name, value in outputs.items()}
    # The bytes signature on the same pixels, PNG-encoded (lossless).
    encoded = [tf.io.encode_png(tf.constant(image.round().clip(0, 255).astype(np.uint8))) for image in images]
    by_bytes = loaded.signatures["serving_bytes"](image_bytes=tf.stack(encoded))
    result.update({f"bytes_{name}": value.numpy() for name, value in by_bytes.items()})
    result["signatures"] = np.array(["", "bytes_"])  # the output prefix of each signature run
    latency = _median_latency_ms(lambda x: serve(images=tf.constant(x)), images[:1], runs)
    return result, latency


def run_tflite(path, images, runs):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=1)
    (input_detail,) = interpreter.get_input_details()
    # A resizable input (-1 height and width: a dynamic model) takes the images' size.
    interpreter.resize_tensor_input(input_detail["index"], [1, *images.shape[1:]])
    interpreter.allocate_tensors()
    (input_detail,) = interpreter.get_input_details()
    output_index = interpreter.get_output_details()[0]["index"]

    def predict_one(image):  # image: (1, H, W, C)
        interpreter.set_tensor(input_detail["index"], image.astype(input_detail["dtype"]))
        interpreter.invoke()
        return interpreter.get_tensor(output_index).copy()

    probabilities = np.concatenate([predict_one(images[i:i + 1]) for i in range(len(images))])
    return {"probabilities": probabilities}, _median_latency_ms(predict_one, images[:1], runs)


def run_onnx(path, images, runs):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_names = [o.name for o in session.get_outputs()]
    (probabilities,) = session.run(output_names[:1], {input_name: images})

    def predict_one(image):
        return session.run(output_names[:1], {input_name: image})

    return {"probabilities": probabilities}, _median_latency_ms(predict_one, images[:1], runs)


def _hf_normalization(path):
    """(mean, std) of the directory's preprocessor_config.json, as its image
    processor applies them after x / 255 (ViT's default: 0.5, 0.5, i.e. [-1, 1])."""
    import json
    import os

    config_file = os.path.join(path, "preprocessor_config.json")
    config = {}
    if os.path.exists(config_file):
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    if not config.get("do_normalize", True):
        return np.float32(0.0), np.float32(1.0)
    return (np.asarray(config.get("image_mean", [0.5] * 3), np.float32),
            np.asarray(config.get("image_std", [0.5] * 3), np.float32))


def run_hf(path, images, runs):
    # What a transformers user runs: their processor's (x / 255 - mean) / std (ViT's 0.5, 0.5: [-1, 1]), then
    # softmax, or sigmoid where config.json says the head is multi-label (HF's problem_type, as its pipelines read it).
    import torch
    import transformers

    torch.set_num_threads(1)
    model = transformers.ViTForImageClassification.from_pretrained(path).eval()
    multi_label = model.config.problem_type == "multi_label_classification"
    mean, std = _hf_normalization(path)

    def predict_one(batch):
        pixels = torch.from_numpy(np.ascontiguousarray(((batch / 255.0 - mean) / std).astype(np.float32)
                                                       .transpose(0, 3, 1, 2)))
        with torch.no_grad():
            logits = model(pixel_values=pixels).logits
            return (torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)).numpy()

    return {"probabilities": predict_one(images)}, _median_latency_ms(predict_one, images[:1], runs)


RUNNERS = {"saved_model": run_saved_model, "tflite": run_tflite, "onnx": run_onnx, "hf": run_hf}


def main(argv):
    kind, artifact, images_path, out_path = argv[:4]
    runs = int(argv[4]) if len(argv) > 4 else 20
    images = np.load(images_path).astype(np.float32)
    result, latency = RUNNERS[kind](artifact, images, runs)
    # TF strings come back as object arrays of bytes: store them as unicode, no pickling.
    result = {k: np.char.decode(v.astype(bytes), "utf-8") if v.dtype == object else v for k, v in result.items()}
    np.savez(out_path, latency_ms=np.float64(latency), **result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
