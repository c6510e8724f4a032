"""Export a small ViT trained on real MNIST digits to every format; every
artifact is reloaded in a fresh process and compared with Keras."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.export import ExportFailed, FORMATS, export
from keras_vit.export import data as data_lib
from keras_vit.export import saved_model as saved_model_lib
from keras_vit.export import serving, validate

# Markers (setup.cfg): multi-process / long end-to-end runs stay out of `make test-fast`.
pytestmark = [pytest.mark.slow]

NUM_TRAIN, NUM_CALIBRATION, NUM_VALIDATION = 3500, 200, 600


@pytest.fixture(scope="module", autouse=True)
def fresh_runners():
    """Every artifact here runs in a process of its own, as a user's export runs it (elsewhere the
    suite hands SavedModels and HF folders to a long-lived runner: tests/runners.py)."""
    from tests import runners

    runners.ENABLED["on"] = False
    yield
    runners.ENABLED["on"] = True


@pytest.fixture(scope="module")
def digits():
    return data_lib.mnist_digits(seed=0)  # shuffled: the file is sorted by class


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    """A 2-block ViT fitted for a few epochs on 3500 digits: well above chance, a real int8 test."""
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        keras_vit.ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2),
        image_size=28, num_classes=10, num_channels=1, include_preprocessing=True, name="digits")
    # No XLA: its compile took ~17 s on 2 cores and sped up none of these 440 small steps.
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    train = digits.take(0, NUM_TRAIN)
    model.fit(train.images, train.labels, batch_size=64, epochs=8, verbose=0)
    workdir = tmp_path_factory.mktemp("workdir")
    model.save(workdir / "model.keras")
    (workdir / "labels.txt").write_text("".join(f"digit {i}\n" for i in range(10)))
    return model, workdir


@pytest.fixture(scope="module")
def exported(trained, digits, tmp_path_factory):
    model, workdir = trained
    out = tmp_path_factory.mktemp("exports")
    calibration = digits.take(0, NUM_CALIBRATION)  # training digits: a sample of the user's data
    validation = digits.take(NUM_TRAIN, NUM_TRAIN + NUM_VALIDATION)  # never trained on
    # This 2-block model, trained for seconds, has many near-ties between its top
    # two classes, where int8 rounding flips ~1% of answers without costing
    # accuracy: it is held to 98% agreement (the default gate is 99%) and, as
    # the issue asks, at most 0.5 points of accuracy.
    report = export(str(workdir), FORMATS, str(out), validation_data=validation, calibration_data=calibration,
                    latency_runs=5, verbose=False, raise_on_failure=False,
                    thresholds={"tflite-int8": {"min_agreement": 0.98}})
    return report, out, validation


def test_every_format_passes_its_thresholds(exported):
    report, out, validation = exported
    by_format = {a["format"]: a for a in report["artifacts"]}
    assert list(by_format) == list(FORMATS)
    for fmt, row in by_format.items():
        assert row["passed"], (fmt, row["failures"], row.get("notes"))
        assert row["installed"] and os.path.exists(row["path"])
        assert row["size_bytes"] > 1000 and row["latency_ms"] > 0
    assert report["passed"]
    assert report["keras"]["accuracy"] > 0.6  # chance is 0.1
    for fmt in ("saved_model", "tflite", "onnx"):
        assert by_format[fmt]["max_abs_diff"] <= 1e-4
    on_disk = json.loads((out / "report.json").read_text())
    assert [a["format"] for a in on_disk["artifacts"]] == list(FORMATS)
    assert (out / "labels.txt").read_text().splitlines() == [f"digit {i}" for i in range(10)]
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # staging cleaned up


def test_int8_keeps_accuracy_on_real_digits(exported):
    report, out, validation = exported
    row = next(a for a in report["artifacts"] if a["format"] == "tflite-int8")
    assert report["validation"]["num_images"] == NUM_VALIDATION and report["validation"]["labels"]
    assert row["accuracy_drop"] <= 0.005, row["notes"]["tried"]  # at most 0.5 points top-1
    assert row["top1_agreement"] >= 0.98
    assert "FULLY_CONNECTED" in row["notes"]["ops"] and "QUANTIZE" in row["notes"]["ops"]
    assert not [op for op in row["notes"]["ops"] if op.startswith("Flex")]


# The installed SavedModel reloads in a fresh process too: test_saved_model_cli_run (TF's own CLI, its
# probabilities compared with Keras as here), one TensorFlow start instead of two.
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "saved_model"])
def test_installed_artifact_reloads_in_a_fresh_process(exported, trained, fmt, tmp_path):
    report, out, validation = exported
    row = next(a for a in report["artifacts"] if a["format"] == fmt)
    images = validation.images[:16]
    np.save(tmp_path / "images.npy", images)
    outputs = validate.run_fresh(fmt, row["path"], str(tmp_path / "images.npy"), str(tmp_path / "o.npz"), 1)
    _close_to_keras(outputs["probabilities"], trained[0], images, fmt)


def _close_to_keras(probabilities, model, images, fmt):
    reference = serving.keras_probabilities(model, images)
    tolerance = {"tflite-fp16": 1e-2, "tflite-dynamic": 0.2, "tflite-int8": 0.5}.get(fmt, 1e-4)
    np.testing.assert_allclose(probabilities, reference, atol=tolerance)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-2)


def test_saved_model_layout_signatures_and_corrupt_bytes(exported):
    report, out, validation = exported
    path = pathlib.Path(next(a["path"] for a in report["artifacts"] if a["format"] == "saved_model"))
    assert path.parent.parent == out and path.name == "1"  # <out>/<name>/<version>
    assert (path / "saved_model.pb").exists()
    assert (path / "assets" / "labels.txt").read_text().splitlines()[3] == "digit 3"
    loaded = tf.saved_model.load(str(path))
    assert set(saved_model_lib.SIGNATURES) <= set(loaded.signatures)
    for batch in (1, 5):  # any batch size
        result = loaded.signatures["serving_default"](images=tf.constant(validation.images[:batch]))
        assert result["probabilities"].shape == (batch, 10)
        assert result["top_k_ids"].shape == result["top_k_labels"].shape == (batch, 5)
        ids, names = result["top_k_ids"].numpy(), result["top_k_labels"].numpy()
        assert all(n.decode() == f"digit {i}" for i, n in zip(ids.ravel(), names.ravel()))
    # A 56x56 RGB JPEG: decoded to grey, resized to 28x28 in the graph.
    big = np.repeat(np.kron(validation.images[0], np.ones((2, 2, 1))), 3, axis=-1).astype(np.uint8)
    jpeg = tf.io.encode_jpeg(tf.constant(big), quality=100)
    result = loaded.signatures["serving_bytes"](image_bytes=tf.stack([jpeg]))
    assert result["probabilities"].shape == (1, 10)
    for corrupt in (b"not an image", tf.io.encode_png(tf.constant(big)).numpy()[:40]):
        with pytest.raises(tf.errors.InvalidArgumentError):
            loaded.signatures["serving_bytes"](image_bytes=tf.constant([corrupt]))
    # ... and the model still serves after the bad request.
    assert loaded.signatures["serving_bytes"](image_bytes=tf.stack([jpeg]))["probabilities"].shape == (1, 10)


def test_saved_model_cli_run(exported, trained, tmp_path):
    """TF's saved_model_cli runs the installed SavedModel in a fresh process: its outputs as Keras'
    (test_installed_artifact_reloads_in_a_fresh_process for the SavedModel)."""
    report, out, validation = exported
    images = np.concatenate([np.full((2, 28, 28, 1), 255.0, dtype=np.float32), validation.images[:16]])
    np.save(tmp_path / "x.npy", images)
    path = next(a["path"] for a in report["artifacts"] if a["format"] == "saved_model")
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    done = subprocess.run(
        [cli, "run", "--dir", path, "--tag_set", "serve", "--signature_def", "serving_default",
         "--inputs", f"images={tmp_path / 'x.npy'}", "--outdir", str(tmp_path / "outputs")],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-2000:]
    written = sorted(p.name for p in (tmp_path / "outputs").iterdir())
    assert written == ["probabilities.npy", "top_k_ids.npy", "top_k_labels.npy", "top_k_probabilities.npy"]
    labels = np.load(tmp_path / "outputs" / "top_k_labels.npy", allow_pickle=True)
    ids = np.load(tmp_path / "outputs" / "top_k_ids.npy")
    assert [n.decode() for n in labels.ravel()] == [f"digit {i}" for i in ids.ravel()]
    _close_to_keras(np.load(tmp_path / "outputs" / "probabilities.npy"), trained[0], images, "saved_model")


def test_failed_export_leaves_previous_artifacts_intact(exported, trained, digits, tmp_path, monkeypatch):
    """A failed --overwrite leaves the previous export as it was, report included (#22.6)."""
    model, workdir = trained
    first, exports, _ = exported
    assert first["passed"]
    # The previous export: a copy of the module's (every format, passed), not a second export of its own.
    previous = tmp_path / "previous"
    shutil.copytree(exports, previous)
    validation = digits.take(NUM_TRAIN, NUM_TRAIN + 50)

    def snapshot():
        return {str(p.relative_to(previous)): p.read_bytes() for p in sorted(previous.rglob("*")) if p.is_file()}

    before = snapshot()

    # The SavedModel writer dies half-way; the TFLite model misses an impossible threshold.
    def half_written(model, labels, path, top_k=5, **settings):
        os.makedirs(os.path.join(path, "variables"))
        open(os.path.join(path, "saved_model.pb"), "wb").write(b"partial")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(saved_model_lib, "write", half_written)
    with pytest.raises(ExportFailed, match="the export already in .* is as it was") as failure:
        export(model, "saved_model,tflite", str(previous), validation_data=validation, name="digits", version=1,
               latency_runs=1, verbose=False, thresholds={"tflite": {"max_abs_diff": -1.0}}, overwrite=True)
    rows = {a["format"]: a for a in failure.value.report["artifacts"]}
    assert "disk full" in rows["saved_model"]["failures"][0]
    assert "max abs diff" in rows["tflite"]["failures"][0]
    assert failure.value.report["report_path"] is None and not any(a["installed"] for a in rows.values())
    assert snapshot() == before
    assert not [p for p in os.listdir(previous) + os.listdir(tmp_path) if p.startswith(".")]  # no staging left
