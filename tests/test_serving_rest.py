"""The exported SavedModel against TF Serving's REST predict API, in-process.

No TF Serving binary can be installed here, so a small adapter below plays
the server: it implements the request and response bodies documented at
https://www.tensorflow.org/tfx/serving/api_rest ("Predict API") on top of the
SavedModel's signatures, behind a loopback HTTP server. What is tested is our
side of the contract: the signature names, input and output names, dtypes and
shapes that a real server maps those bodies onto. The real server is

    docker run --rm -p 8501:8501 -v "$PWD/exports/NAME/NAME:/models/NAME" -e MODEL_NAME=NAME tensorflow/serving
"""

import base64
import http.server
import io
import json
import threading
import urllib.error
import urllib.request

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from keras_vit.export import export
from keras_vit.export import serving

from .conftest import tiny_config

LABELS = [f"class {i}" for i in range(5)]


# --- the adapter: TF Serving's REST predict semantics over a loaded SavedModel ---

def _bytes_of(value):
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise ValueError(f"binary values must be {{'b64': ...}}, got keys {sorted(value)}")
        return base64.b64decode(value["b64"])
    return value.encode() if isinstance(value, str) else value


def _to_tensor(values, spec):
    """A JSON batch -> a tensor of the input's dtype ({"b64": ...} for DT_STRING)."""
    if spec.dtype == tf.string:
        return tf.constant([_bytes_of(v) for v in values], tf.string)
    return tf.constant(np.asarray(values, dtype=spec.dtype.as_numpy_dtype))


def _to_json(array):
    if array.dtype == object:  # strings: UTF-8 text (the server base64-encodes other bytes)
        return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(array).tolist()
    return array.tolist()


def rest_predict(loaded, body):
    """(status, response body) for one POST .../v1/models/NAME:predict."""
    name = body.get("signature_name", "serving_default")
    if name not in loaded.signatures:
        return 400, {"error": f"Serving signature name: \"{name}\" not found in signature def"}
    signature = loaded.signatures[name]
    specs = signature.structured_input_signature[1]  # {input name: TensorSpec}
    if ("instances" in body) == ("inputs" in body):
        return 400, {"error": "JSON Value must have exactly one of 'instances' (row) or 'inputs' (columnar)"}
    try:
        if "instances" in body:
            rows = body["instances"]
            if len(specs) == 1 and not all(isinstance(r, dict) and set(r) <= set(specs) and "b64" not in r
                                           for r in rows):
                rows = [{next(iter(specs)): r} for r in rows]
            columns = {k: [r[k] for r in rows] for k in specs}
        else:
            inputs = body["inputs"]
            columns = inputs if isinstance(inputs, dict) and set(inputs) <= set(specs) else {next(iter(specs)): inputs}
        tensors = {k: _to_tensor(v, specs[k]) for k, v in columns.items()}
        outputs = {k: v.numpy() for k, v in signature(**tensors).items()}
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
        message = error.message if isinstance(error, tf.errors.OpError) else str(error)
        return 400, {"error": message.strip().splitlines()[0]}
    if "instances" in body:
        batch = len(next(iter(outputs.values())))
        return 200, {"predictions": [{k: _to_json(v[i]) for k, v in outputs.items()} for i in range(batch)]}
    return 200, {"outputs": {k: _to_json(v) for k, v in outputs.items()}}


class _Handler(http.server.BaseHTTPRequestHandler):
    loaded = None
    model_name = None

    def do_POST(self):  # noqa: N802 - http.server's name
        if self.path != f"/v1/models/{self.model_name}:predict":
            status, reply = 404, {"error": f"Could not find any versions of model {self.path}"}
        else:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, reply = rest_predict(self.loaded, body)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


# --- fixtures ---

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A perturbed tiny RGB ViT exported with keras_vit.export, served on loopback."""
    keras.utils.set_random_seed(3)
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=len(LABELS), name="tiny")
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.2, w.shape).astype(w.dtype) for w in model.get_weights()])
    out = tmp_path_factory.mktemp("exports")
    pixels = rng.integers(0, 256, (8, 16, 16, 3)).astype(np.float32)
    report = export(model, "saved_model", str(out), validation_data=pixels, labels=LABELS, latency_runs=1,
                    verbose=False)
    path = next(a["path"] for a in report["artifacts"] if a["format"] == "saved_model")
    handler = type("Handler", (_Handler,), {"loaded": tf.saved_model.load(path), "model_name": "tiny"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/models/tiny:predict"
    yield model, url
    server.shutdown()


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def png_b64(pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def reference(model, pixels):
    return serving.keras_probabilities(model, np.asarray(pixels, np.float32))


# --- the contract ---

@pytest.mark.parametrize("batch", [1, 4])
def test_row_format_float_pixels(served, batch):
    model, url = served
    pixels = np.random.default_rng(batch).integers(0, 256, (batch, 16, 16, 3)).astype(np.float32)
    status, reply = post(url, {"instances": pixels.tolist()})
    assert status == 200, reply
    assert len(reply["predictions"]) == batch
    expected = reference(model, pixels)
    for row, want in zip(reply["predictions"], expected):
        assert set(row) == {"probabilities", "top_k_ids", "top_k_probabilities", "top_k_labels"}
        np.testing.assert_allclose(row["probabilities"], want, atol=1e-5)
        assert row["top_k_ids"][0] == int(np.argmax(want))
        assert row["top_k_labels"][0] == LABELS[int(np.argmax(want))]
        assert len(row["top_k_ids"]) == 5


def test_row_format_named_inputs_and_columnar_format_agree(served):
    model, url = served
    pixels = np.random.default_rng(7).integers(0, 256, (3, 16, 16, 3)).astype(np.float32)
    _, rows = post(url, {"signature_name": "serving_default", "instances": [{"images": p.tolist()} for p in pixels]})
    status, columns = post(url, {"inputs": {"images": pixels.tolist()}})
    assert status == 200, columns
    np.testing.assert_allclose(columns["outputs"]["probabilities"], [r["probabilities"] for r in rows["predictions"]],
                               atol=1e-6)
    _, bare = post(url, {"inputs": pixels.tolist()})  # a single input may be given unnamed
    np.testing.assert_allclose(bare["outputs"]["probabilities"], reference(model, pixels), atol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])
def test_b64_image_bytes_into_the_bytes_signature(served, batch):
    model, url = served
    pixels = np.random.default_rng(10 + batch).integers(0, 256, (batch, 16, 16, 3))
    body = {"signature_name": "serving_bytes", "instances": [{"b64": png_b64(p)} for p in pixels]}
    status, reply = post(url, body)
    assert status == 200, reply
    np.testing.assert_allclose([r["probabilities"] for r in reply["predictions"]], reference(model, pixels),
                               atol=1e-5)
    status, named = post(url, {"signature_name": "serving_bytes",
                               "instances": [{"image_bytes": {"b64": png_b64(p)}} for p in pixels]})
    assert status == 200 and named == reply
    status, columnar = post(url, {"signature_name": "serving_bytes",
                                  "inputs": {"image_bytes": [{"b64": png_b64(p)} for p in pixels]}})
    assert status == 200
    np.testing.assert_allclose(columnar["outputs"]["probabilities"], reference(model, pixels), atol=1e-5)


def test_corrupt_image_in_a_batch_fails_that_request_and_the_server_goes_on(served):
    model, url = served
    good = np.random.default_rng(5).integers(0, 256, (16, 16, 3))
    corrupt = base64.b64encode(b"\x89PNG\r\n\x1a\n not really a png").decode()
    status, reply = post(url, {"signature_name": "serving_bytes",
                               "instances": [{"b64": png_b64(good)}, {"b64": corrupt}]})
    assert status == 400
    assert set(reply) == {"error"} and reply["error"]
    status, reply = post(url, {"signature_name": "serving_bytes", "instances": [{"b64": png_b64(good)}]})
    assert status == 200
    np.testing.assert_allclose(reply["predictions"][0]["probabilities"], reference(model, good[None])[0], atol=1e-5)


def test_bad_requests_get_an_error_body(served):
    _, url = served
    status, reply = post(url, {"signature_name": "nope", "instances": [[0]]})
    assert status == 400 and "nope" in reply["error"]
    status, reply = post(url, {"instances": np.zeros((1, 8, 8, 3)).tolist()})  # wrong image size
    assert status == 400 and reply["error"]
    status, reply = post(url, {"instances": [], "inputs": []})
    assert status == 400 and "exactly one" in reply["error"]
