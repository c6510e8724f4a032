"""The tflite section of benchmarks/bench.py: batch-1 latency and top-1
agreement with Keras of the artifacts keras_vit.export writes."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from typing import List

import numpy as np

from bench_core import _cores, _keras_vit_model, _parse_case, _ratio_to, alternate, macs_per_image

# TFLite/ONNX artifacts, by keras_vit.export format name, with the names the tables use.
ARTIFACTS = {
    "tflite": "TFLite float32",
    "tflite-fp16": "TFLite float16 weights",
    "tflite-dynamic": "TFLite dynamic-range int8 (int8 weights, float activations)",
    "tflite-int8": "TFLite full-integer int8 (calibrated)",
    "onnx": "ONNX Runtime float32",
}
INTEGER_ARTIFACTS = ("tflite-dynamic", "tflite-int8")  # no float32 matmul limit applies



def tflite_artifacts(model, formats, scratch, calibration, reference, min_agreement, log):
    """{format: (bytes, notes)} through keras_vit.export's own converters:
    one SavedModel source (pixels 0..255 in, probabilities out) for every
    TFLite kind, tf2onnx for ONNX."""
    from keras_vit.export import onnx_model, tflite, tflite_int8

    source = os.path.join(scratch, "tflite_source")
    out = {}
    for fmt in formats:
        start = time.perf_counter()
        if fmt == "onnx":
            path = os.path.join(scratch, "model.onnx")
            with contextlib.redirect_stdout(open(os.devnull, "w")):
                onnx_model.write(model, path)
            with open(path, "rb") as f:
                out[fmt] = (f.read(), {"opset": onnx_model.OPSET})
        else:
            if not os.path.isdir(source):
                tflite.write_source(model, source)
            # min_agreement 0 keeps the first plan, "all int8": a full-integer model.
            out[fmt] = tflite.convert(source, fmt, calibration, reference,
                                      max_accuracy_drop=1.0, min_agreement=min_agreement,
                                      quantize=tflite_int8.quantize)
        log(f"  converted {fmt} in {time.perf_counter() - start:.0f} s")
    return out


def _onnx_runner(content, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(content, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: session.run(None, {name: images})[0]


def _tflite_runner(content, threads):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content, num_threads=threads)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0]["index"], interpreter.get_output_details()[0]["index"]

    def run(image):
        interpreter.set_tensor(inp, image)
        interpreter.invoke()
        return interpreter.get_tensor(out)

    return run


def run_tflite(args, probe, log) -> List[dict]:
    """Batch-1 latency of every artifact beside Keras (the same pixels-to-
    probabilities function, TF graph, all cores), and each one's top-1
    agreement with Keras.

    The model is a randomly initialised ViT with its zero-initialised head
    replaced by random weights (so the argmax depends on the image), fed
    random pixels: calibration and agreement images are random, which is
    enough for timing and for checking that a conversion keeps the argmax,
    not for accuracy (keras-vit export measures that on real data).
    """
    import tensorflow as tf

    from keras_vit.export import serving
    from keras_vit.export.data import Images

    variant, size = _parse_case(args.tflite_case)
    model = _keras_vit_model(variant, size, "float32", include_top=True)
    head = model.get_layer("head")
    kernel = head.kernel
    kernel.assign(np.random.RandomState(2).normal(0, kernel.shape[0] ** -0.5, kernel.shape).astype("float32"))
    rng = np.random.RandomState(3)
    calibration = Images(rng.uniform(0, 255, (args.calibration_images, size, size, 3)).astype("float32"),
                         source="random pixels")
    agreement_images = rng.uniform(0, 255, (args.agreement_images, size, size, 3)).astype("float32")
    reference_on_calibration = serving.keras_probabilities(model, calibration.images)
    keras_reference = serving.keras_probabilities(model, agreement_images)
    formats = [f for f in ARTIFACTS if f != "onnx" or _has("tf2onnx", "onnxruntime")]
    scratch = tempfile.mkdtemp(prefix="keras-vit-bench-")
    try:
        artifacts = tflite_artifacts(model, formats, scratch, calibration, reference_on_calibration,
                                     args.int8_min_agreement, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    keras_fn = tf.function(lambda x: serving.probabilities(model, x))
    predictors = {"keras": lambda image: keras_fn(tf.constant(image)).numpy()}
    for fmt, (content, _) in artifacts.items():
        predictors[fmt] = (_onnx_runner if fmt == "onnx" else _tflite_runner)(content, args.tflite_threads)
    agreement = {}
    for name, predict in predictors.items():
        top1 = np.array([predict(image[None]).argmax() for image in agreement_images])
        agreement[name] = float(np.mean(top1 == keras_reference.argmax(1)))
    image = agreement_images[:1]
    runners = {name: (lambda predict=predict: predict(image)) for name, predict in predictors.items()}
    log(f"tflite {variant}@{size} batch 1, {args.tflite_threads} threads: {', '.join(runners)}")
    probe.reset()
    rounds = alternate(runners, args.rounds, args.block_seconds, probe)
    flops = 2 * macs_per_image(variant, size)
    cores = _cores()
    rows = []
    for name, times in rounds.items():
        s = statistics.median(times)
        content, notes = artifacts.get(name, (None, {}))
        rows.append({
            "variant": variant, "image_size": size, "format": name,
            "kind": "Keras float32 (TF graph)" if name == "keras" else ARTIFACTS[name],
            "threads": cores if name == "keras" else args.tflite_threads,
            "latency_ms": 1000 * s, "round_seconds": times,
            "megabytes": None if content is None else len(content) / 2 ** 20,
            "speedup_vs_tflite_float32": _ratio_to(rounds, name, "tflite"),
            "speedup_vs_keras": _ratio_to(rounds, name, "keras"),
            "top1_agreement_with_keras": agreement[name], "agreement_images": len(agreement_images),
            # integer kernels: a float32 fraction would be no limit at all
            "fraction_of_float32_peak": None if name in INTEGER_ARTIFACTS else flops / s / 1e9 / probe.peak("float32"),
            "int8_plan": notes.get("plan"),
            "calibration": f"{len(calibration)} random-pixel images" if name == "tflite-int8" else None,
        })
        log(f"  {rows[-1]['kind']:62s} {1000 * s:8.1f} ms  top-1 agreement {agreement[name]:.0%}")
    return rows


def _has(*modules):
    try:
        for module in modules:
            __import__(module)
        return True
    except ImportError:
        return False
