"""The exported SavedModel against TF Serving's REST predict API, in-process.

No TF Serving binary can be installed here, so a small adapter below plays
the server: it implements the request and response bodies documented at
https://www.tensorflow.org/tfx/serving/api_rest ("Predict API") on top of the
SavedModel's signatures, behind a loopback HTTP server. What is tested is our
side of the contract: the signature names, input and output names, dtypes and
shapes that a real server maps those bodies onto. The bytes signature is also run in a
fresh process, as a server loads it, on files of every kind keras_vit.images
reads, against `keras-vit predict` on the same files. The real server is

    docker run --rm -p 8501:8501 -v "$PWD/exports/NAME/NAME:/models/NAME" -e MODEL_NAME=NAME tensorflow/serving
"""

import base64
import http.server
import io
import json
import os
import subprocess
import sys
import textwrap
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
from keras_vit.export import image_bytes
from keras_vit.export import serving
from keras_vit.images import load_image
from keras_vit.inspection import predict

from . import image_files
from .conftest import tiny_config

# The module's SavedModel costs 21 s to export and validate: make test runs it, make test-fast does not (#36).
pytestmark = pytest.mark.slow

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
        return 400, {"error": message.strip()}  # TF Serving sends the whole status message
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
def exported(tmp_path_factory):
    """A perturbed tiny RGB ViT exported with keras_vit.export: (model, SavedModel path)."""
    keras.utils.set_random_seed(3)
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=len(LABELS), name="tiny")
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.2, w.shape).astype(w.dtype) for w in model.get_weights()])
    out = tmp_path_factory.mktemp("exports")
    pixels = rng.integers(0, 256, (8, 16, 16, 3)).astype(np.float32)
    report = export(model, "saved_model", str(out), validation_data=pixels, labels=LABELS, latency_runs=1,
                    verbose=False)
    return model, next(a["path"] for a in report["artifacts"] if a["format"] == "saved_model")


@pytest.fixture(scope="module")
def served(exported):
    """The exported model served on loopback: (model, predict URL)."""
    model, path = exported
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
@pytest.mark.slow
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


# --- the bytes signature sees the pixels `keras-vit predict` sees ---

def _exif(orientation, little_endian=False):
    exif = Image.Exif()
    if little_endian:  # as many Android phones write it, with tags before the orientation
        exif.endian = "<"
        exif[0x010F], exif[0x0110] = "Maker", "Model"
    exif[0x0112] = orientation
    return exif


def _image_files(folder):
    """{name: path}: one non-symmetric picture (24x40: a wrong orientation
    changes what a 16x16 model sees) in each kind of file keras_vit.images
    decodes: EXIF orientations 1-8, 16-bit, palette, alpha, grey, CMYK, ..."""
    rgb = image_files.picture(24, 40, seed=4)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    low_bytes = np.random.default_rng(4).integers(0, 256, rgb.shape).astype(np.uint16)  # high byte != rounding
    files = {f"orientation{o}{endian}.jpg": image_files.encoded(rgb, "JPEG", quality=90, exif=_exif(o, endian))
             for o in range(1, 9) for endian in ("", "_II")}
    files.update({
        "orientation6.png": image_files.encoded(rgb, "PNG", exif=_exif(6)),  # an eXIf chunk
        "orientation8_II.webp": image_files.encoded(rgb, "WEBP", lossless=True, exif=_exif(8, True)),
        "sixteen_gray.png": image_files.encoded(gray.astype(np.uint16) * 256 + low_bytes[..., 0], "PNG"),
        "sixteen_rgb.png": tf.io.encode_png(tf.constant(rgb.astype(np.uint16) * 256 + low_bytes)).numpy(),
        "palette.png": image_files.encoded(rgb, "PNG", "P"),
        "rgba.png": image_files.encoded(np.dstack([rgb, 255 - gray]), "PNG"),
        "gray_alpha.png": image_files.encoded(rgb, "PNG", "LA"),
        "gray.png": image_files.encoded(gray, "PNG"),
        "gray.jpg": image_files.encoded(gray, "JPEG", quality=90),
        "one_bit.png": image_files.encoded(rgb, "PNG", "1"),
        "progressive.jpg": image_files.encoded(rgb, "JPEG", progressive=True, quality=90),
        "cmyk.jpg": image_files.encoded(rgb, "JPEG", "CMYK", quality=95),  # Adobe's marker, as Pillow writes it
        "first.gif": image_files.encoded(rgb, "GIF"),
        "rgb.bmp": image_files.encoded(rgb, "BMP"),
        "palette.bmp": image_files.encoded(rgb, "BMP", "P"),
        "rgba.bmp": image_files.encoded(np.dstack([rgb, gray]), "BMP"),
        "lossy.webp": image_files.encoded(rgb, "WEBP", quality=80),
        "rgba.webp": image_files.encoded(np.dstack([rgb, gray]), "WEBP", lossless=True),
    })
    paths = {}
    for name, content in files.items():
        paths[name] = str(folder / name)
        with open(paths[name], "wb") as f:
            f.write(content)
    return paths


# As a server runs it: the SavedModel loaded in a process that never built the model.
FRESH_PROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf

    saved_model, job, out = sys.argv[1:]
    job = np.load(job)
    loaded = tf.saved_model.load(saved_model)
    encoded = [open(path, "rb").read() for path in job["files"]]
    by_bytes = loaded.signatures["serving_bytes"](image_bytes=tf.constant(encoded))
    by_pixels = loaded.signatures["serving_default"](images=tf.constant(job["pixels"]))
    np.savez(out, bytes=by_bytes["probabilities"].numpy(), pixels=by_pixels["probabilities"].numpy())
""")


@pytest.fixture(scope="module")
def predicted(exported, tmp_path_factory):
    """{name: (path, keras-vit predict's probabilities, the pixels it read)} for every kind of file."""
    model, _ = exported
    paths = _image_files(tmp_path_factory.mktemp("files"))
    found, failures = predict.predict_files(model, list(paths.values()), top_k=len(LABELS), progress=False)
    assert not failures
    by_path = {}
    for p in found:  # top-k of all classes -> the probability of each class
        by_path[p.path] = np.zeros(len(LABELS), np.float32)
        by_path[p.path][p.indices] = p.probabilities
    return {name: (path, by_path[path], load_image(path, model.image_size, 3))
            for name, path in paths.items()}


@pytest.mark.slow
def test_bytes_in_a_fresh_process_are_the_pixels_and_probabilities_of_keras_vit_predict(exported, predicted,
                                                                                           tmp_path):
    _, saved_model = exported
    names = sorted(predicted)
    paths, expected, pixels = (np.array([predicted[n][i] for n in names]) for i in range(3))
    np.savez(tmp_path / "job.npz", files=paths, pixels=pixels.astype(np.float32))
    subprocess.run([sys.executable, "-c", FRESH_PROCESS, saved_model, str(tmp_path / "job.npz"),
                    str(tmp_path / "out.npz")], check=True, timeout=300,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    out = np.load(tmp_path / "out.npz")
    for name, by_bytes, by_pixels, want in zip(names, out["bytes"], out["pixels"], expected):
        # The same pixels as keras-vit predict read (through serving_default, in the same graph) ...
        np.testing.assert_allclose(by_bytes, by_pixels, atol=1e-6, err_msg=name)
        # ... and so its probabilities.
        np.testing.assert_allclose(by_bytes, want, atol=1e-4, err_msg=name)
    # The check can fail: the orientation changes what the model sees.
    by_name = dict(zip(names, out["bytes"]))
    assert np.abs(by_name["orientation6.jpg"] - by_name["orientation1.jpg"]).max() > 1e-3


def test_b64_files_through_rest_give_keras_vit_predicts_probabilities(served, predicted):
    _, url = served
    names = sorted(predicted)
    instances = []
    for name in names:
        with open(predicted[name][0], "rb") as f:
            instances.append({"b64": base64.b64encode(f.read()).decode()})
    status, reply = post(url, {"signature_name": "serving_bytes", "instances": instances})
    assert status == 200, reply
    for name, row in zip(names, reply["predictions"]):
        np.testing.assert_allclose(row["probabilities"], predicted[name][1], atol=1e-4, err_msg=name)


def _without_segment(jpeg, marker):
    at = jpeg.index(marker)
    return jpeg[:at] + jpeg[at + 2 + int.from_bytes(jpeg[at + 2:at + 4], "big"):]


def test_files_tensorflow_cannot_read_as_pillow_are_refused_with_the_reason(served):
    _, url = served
    rgb = image_files.picture(12, 16)
    frames = [Image.fromarray(rgb), Image.fromarray(255 - rgb)]
    animated = io.BytesIO()
    frames[0].save(animated, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    refused = {
        "format": image_files.encoded(rgb, "TIFF"),
        "animated_webp": animated.getvalue(),
        "cmyk": _without_segment(image_files.encoded(rgb, "JPEG", "CMYK"), b"\xff\xee"),  # no Adobe APP14
        "bmp": image_files.encoded(rgb, "BMP", "1"),
    }
    for reason, content in refused.items():
        status, reply = post(url, {"signature_name": "serving_bytes",
                                   "instances": [{"b64": base64.b64encode(content).decode()}]})
        assert status == 400 and image_bytes.REFUSED[reason] in reply["error"], (reason, reply)
    good = {"b64": png_b64(rgb)}  # and the server goes on
    assert post(url, {"signature_name": "serving_bytes", "instances": [good]})[0] == 200
