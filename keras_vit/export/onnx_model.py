"""ONNX via tf2onnx (the optional `onnx` extra), checked with onnxruntime.

Input `images` float32 (B, H, W, C) pixels 0..255 (any batch size), output
`probabilities` (B, classes), as `serving_default`. The tanh-approximated GELU
of the official ViT converts; the exact one would need Erf/Erfc ops.
"""

from __future__ import annotations

import contextlib
import os

from keras_vit.errors import UserError, require
from keras_vit.export.format import Build, ExportFormat

OPSET = 17
PROTOBUF_LIMIT = 2 * 1024**3


def check(model):
    require("tf2onnx", "onnx", "ONNX export")
    require("onnxruntime", "onnx", "Validating the ONNX export")
    config = getattr(model, "config", None)
    # Only the exact GELU needs Erf (quick GELU and SwiGLU are sigmoids; the MAP head's MLP is the blocks').
    if config is not None and getattr(config, "mlp_activation", "gelu") == "gelu" and not config.gelu_approximate:
        raise UserError(f"{model.name} uses the exact GELU (gelu_approximate=False), which tf2onnx cannot convert "
                         f"(no Erfc): rebuild with gelu_approximate=True (outputs change slightly), or export another "
                         f"format.")
    if model.count_params() * 4 >= PROTOBUF_LIMIT:
        raise UserError(f"{model.name} has {model.count_params():,} float32 parameters, over the 2 GiB an ONNX "
                         f"protobuf holds (tf2onnx's large_model zip format is not supported here).")


def write(model, path):
    import tensorflow as tf

    from keras_vit.export import serving

    check(model)
    tf2onnx = require("tf2onnx", "onnx", "ONNX export")
    height, width, channels = serving.input_size(model)
    if serving.is_dynamic(model):  # tf2onnx expresses the in-graph interpolation (an If): any H and W
        height = width = None
    spec = tf.TensorSpec((None, height, width, channels), tf.float32, name="images")
    fn = tf.function(lambda images: {"probabilities": serving.probabilities(model, images)})
    try:
        with _optimizer_errors_raised():
            tf2onnx.convert.from_function(fn, input_signature=[spec], opset=OPSET, output_path=path)
    except Exception:  # noqa: BLE001 - an optimizer failed: tf2onnx's default, which leaves that step out
        tf2onnx.convert.from_function(fn, input_signature=[spec], opset=OPSET, output_path=path)


@contextlib.contextmanager
def _optimizer_errors_raised():
    """tf2onnx (its TF2ONNX_CATCH_ERRORS) with each graph optimizer run in place:
    by default it deep-copies the whole graph before each of its ~36 optimizer
    passes, to carry on without one that fails, and those copies were half of a
    conversion's time. When all pass the model is the same; when one fails,
    `write` converts again the default way."""
    from tf2onnx import constants

    name = constants.ENV_TF2ONNX_CATCH_ERRORS
    before = os.environ.get(name)
    os.environ[name] = "FALSE"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _build(job: Build):
    write(job.model, job.path)
    return {"opset": OPSET}


EXPORT_FORMATS = (ExportFormat(
    name="onnx",
    description="ONNX (tf2onnx, opset 17), run by onnxruntime: pixels in, probabilities out, any batch size",
    layout="{name}.onnx",
    runtime="onnx",
    build=_build,
    check=check,
    extra="onnx",
),)
