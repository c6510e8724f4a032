"""Quantised ViTs (#39): keras_vit.quantize against the definition of Keras' int8,
every family through each mode, `.keras` round trips, the float-only runtimes'
dequantised copy, refusals, and `keras-vit quantize` -> predict -> export."""

import json

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.cli import main
from keras_vit.errors import UserError
from keras_vit.model.lora import merge_lora
from keras_vit.model.quantization import dequantized, projections, quantize, weight_bytes
from keras_vit.weights.layout import variables_by_key
from keras_vit.weights.npz import checkpoint_params
from tests.test_families_model import BASE, FAMILIES, build, perturbed


def _images(seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, size=(4, 16, 16, 3)).astype("float32")


def _relative_error(answer, reference):
    return float(np.linalg.norm(answer - reference) / np.linalg.norm(reference))


def test_int8_kernels_are_per_channel_abs_max_of_the_float_kernels():
    """Keras' int8, written out: each output channel scaled by 127 / its largest |weight| over
    the input axes, rounded. The attention's out projection contracts two axes (heads, width)."""
    model = build("vit", num_layers=1)
    quantized = quantize(model, "int8")
    for (float_layer, axes), (layer, _) in zip(projections(model), projections(quantized)):
        kernel = np.asarray(float_layer.kernel)
        scale = 127.0 / np.abs(kernel).max(axis=tuple(range(axes)), keepdims=True)
        assert str(layer._kernel.dtype) == "int8"
        scaled = kernel * scale
        stored = np.asarray(layer._kernel).astype(np.int32)
        # Exact, but where a value lies within float rounding of a half (Keras scales in its own order).
        tie = np.abs(np.abs(scaled - np.trunc(scaled)) - 0.5) < 1e-4
        np.testing.assert_array_equal(stored[~tie], np.round(scaled).astype(np.int32)[~tie])
        assert np.all(np.abs(stored - scaled) <= 0.5 + 1e-4)
        np.testing.assert_allclose(np.asarray(layer.kernel_scale).reshape(scale.shape), scale, rtol=1e-6)


# Each family once, each mode on at least three families and under mixed_bfloat16 once: the mode is
# a per-layer dtype policy and the family the structure around it, so the product adds no check.
# make test-fast keeps int8 plain and under mixed_bfloat16 (#36: 2.4-4.4 s a case; int4's rounding is
# test_the_dequantised_copy_multiplies_by_the_stored_weights's).
_SLOW = pytest.mark.slow
CASES = [("vit", "int8", None), pytest.param("deit", "int4", None, marks=_SLOW),
         pytest.param("siglip", "int8", None, marks=_SLOW), pytest.param("clip", "int4", None, marks=_SLOW),
         pytest.param("dinov2_reg_swiglu", "int4", None, marks=_SLOW), pytest.param("dinov3", "int8", None, marks=_SLOW),
         pytest.param("vit_gap_repr", "int4", None, marks=_SLOW), ("dinov2", "int8", "mixed_bfloat16"),
         pytest.param("aimv2", "int8", None, marks=_SLOW)]  # AIMv2: projections without biases


def _rounding_bound(kernel, axes, mode):
    """The most rounding may move each weight: half a step of its channel's int8 grid
    (abs-max / 127), or of its group's int4 grid (16 levels over the group's range; these
    kernels have at most 128 input rows, one group)."""
    inputs = tuple(range(axes))
    largest = np.abs(kernel).max(axis=inputs, keepdims=True)
    if mode == "int8":
        return largest / 127 / 2
    return (kernel.max(axis=inputs, keepdims=True) - kernel.min(axis=inputs, keepdims=True)) / 15 / 2


@pytest.fixture
def policy():
    """policy(name): Keras' global dtype policy, which the blocks' layers take, for this test."""
    previous = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(previous)


@pytest.mark.parametrize("family, mode, dtype", CASES)
def test_every_family_quantizes_within_the_rounding_and_round_trips(family, mode, dtype, tmp_path, policy):
    keras.utils.set_random_seed(0)  # the whole-model int8 bound below is a measurement (2-4% here)
    policy(dtype or "float32")
    model = build(family, num_layers=2)
    quantized = quantize(model, mode)
    assert quantized.config.quantization == mode and model.config.quantization is None
    expected_policy = {"int8": "int8", "int4": "int4/128"}[mode] + f"_from_{dtype or 'float32'}"
    assert quantized.encoder.blocks[0].attention.query.dtype_policy.name == expected_policy
    # Each projection multiplies by its float kernel rounded, and by nothing further from it (read
    # back in float32 whatever the policy: under mixed_bfloat16 too).
    plain = dequantized(quantized)
    for (float_layer, axes), (layer, _) in zip(projections(model), projections(plain)):
        kernel, stored = np.asarray(float_layer.kernel, np.float32), np.asarray(layer.kernel, np.float32)
        assert np.all(np.abs(stored - kernel) <= _rounding_bound(kernel, axes, mode) * 1.001 + 1e-7), layer.path
    # What is not a projection is the float model's, bit for bit; the projections hold integers.
    float_weights = {v.path: np.asarray(v) for v in model.weights}
    projection_paths = {v.path for layer, _ in projections(quantized) for v in layer.weights}
    for variable in quantized.weights:
        if variable.path not in projection_paths:
            np.testing.assert_array_equal(np.asarray(variable), float_weights[variable.path])
    assert {str(layer._kernel.dtype) for layer, _ in projections(quantized)} == {"int8"}
    images = _images()
    answer = np.asarray(quantized(images))
    if mode == "int8":  # a whole model of random weights stays close (int4: far coarser, bounded above)
        assert _relative_error(answer.astype(np.float32), np.asarray(model(images), np.float32)) < (
            0.2 if dtype else 0.1)
    quantized.save(tmp_path / "q.keras")
    loaded = keras_vit.load_model(tmp_path / "q.keras")
    assert loaded.config.quantization == mode
    np.testing.assert_array_equal(np.asarray(loaded(images)), answer)


@pytest.mark.parametrize("mode", ["int8", pytest.param("int4", marks=_SLOW)])
def test_another_image_size_keeps_the_integer_weights(mode):
    """with_image_size (export --image-size, --dynamic-image-size) goes through the float values
    and rounds them back: the same integers, and the scales and zero points to their last bit or
    so (a scale is recomputed from the float values); only the positions resize."""
    quantized = quantize(build("vit", num_layers=1), mode)
    resized = quantized.with_image_size(24)
    dynamic = quantized.with_image_size(dynamic_image_size=True)
    for other in (resized, dynamic):
        assert other.config.quantization == mode
        for (layer, _), (resized_layer, _) in zip(projections(quantized), projections(other)):
            for variable, resized_variable in zip(layer.weights, resized_layer.weights):
                if "int" in str(variable.dtype):
                    np.testing.assert_array_equal(np.asarray(resized_variable), np.asarray(variable))
                else:
                    np.testing.assert_allclose(np.asarray(resized_variable), np.asarray(variable), rtol=1e-6)
    images = _images()
    np.testing.assert_allclose(np.asarray(dynamic(images)), np.asarray(quantized(images)), rtol=1e-4, atol=1e-4)
    assert resized(np.zeros((1, 24, 24, 3), "float32")).shape == (1, 5)


@pytest.mark.parametrize("mode, tolerance", [("int4", 1e-5), pytest.param("int8", 0.05, marks=_SLOW)])
def test_the_dequantised_copy_multiplies_by_the_stored_weights(mode, tolerance):
    """What TFLite is converted from: exact for weight-only int4; int8 also rounds the
    projections' inputs, which the float copy does not."""
    keras.utils.set_random_seed(0)  # the int8 bound: 2.8% measured on these weights
    quantized = quantize(build("dinov2_reg_swiglu", num_layers=2), mode)
    plain = dequantized(quantized)
    assert plain.config.quantization is None
    images = _images()
    answer, reference = np.asarray(plain(images)), np.asarray(quantized(images))
    assert _relative_error(answer, reference) < tolerance


@pytest.mark.slow
def test_int8_and_int4_are_smaller_on_disk_and_in_memory(tmp_path):
    model = perturbed(keras_vit.ViT(keras_vit.ViTConfig(**dict(BASE, hidden_size=48, mlp_dim=192)), image_size=16,
                                    num_classes=5))
    sizes = {}
    for mode in (None, "int8", "int4"):
        saved = model if mode is None else quantize(model, mode)
        saved.save(tmp_path / f"{mode}.keras")
        sizes[mode] = ((tmp_path / f"{mode}.keras").stat().st_size, weight_bytes(saved))
    # In memory 0.31x and 0.21x here (the float rest and the scales stay); the files also hold
    # each variable's HDF5 header.
    assert sizes["int8"][1] < 0.35 * sizes[None][1] and sizes["int4"][1] < 0.75 * sizes["int8"][1]
    assert sizes["int8"][0] < 0.6 * sizes[None][0] and sizes["int4"][0] < sizes["int8"][0]


@pytest.mark.slow
def test_a_lora_model_quantized_keeps_its_updates_and_merges_to_float():
    """QLoRA's form: the base integer and frozen, the updates float and training; merging
    gives a float model of the kernels the base multiplies by plus the updates."""
    model = keras_vit.ViT(keras_vit.ViTConfig(**BASE, **FAMILIES["vit"], lora_rank=2), image_size=16, num_classes=5)
    perturbed(model)
    quantized = quantize(model, "int4")
    assert quantized.config.lora_rank == 2 and quantized.config.quantization == "int4"
    updates = {key: v for key, v in variables_by_key(quantized).items() if "lora" in key}
    assert updates and all(v.trainable for v in updates.values())
    assert {v.path for v in quantized.trainable_weights} == {v.path for v in model.trainable_weights}
    images = _images()
    merged = merge_lora(quantized)
    assert merged.config.quantization is None and not merged.config.lora_rank
    np.testing.assert_allclose(np.asarray(merged(images)), np.asarray(quantized(images)), rtol=1e-4, atol=1e-4)


def test_refusals_are_one_line(tmp_path):
    model = build("vit", num_layers=1)
    with pytest.raises(UserError, match="Unknown quantisation mode 'int2': choose int8, int4"):
        quantize(model, "int2")
    with pytest.raises(UserError, match="float8 is not a serving mode here: .* Quantise with int8 or int4"):
        quantize(model, "float8")
    quantized = quantize(model, "int4")
    with pytest.raises(UserError, match="quantised already"):
        quantize(quantized, "int8")
    with pytest.raises(UserError, match="holds int4 weights .* use the float model it was quantised from"):
        keras_vit.save_weights(quantized, tmp_path / "w.npz")
    # The key table names the stored integers (int4's `kernel` is a tensor unpacked on each read).
    assert all(hasattr(v, "path") for v in variables_by_key(quantized).values())
    with pytest.raises(UserError, match="quantization must be None or one of int8, int4"):
        keras_vit.ViTConfig(**BASE, quantization="int3")
    # Float weights are never cast into int8 variables (they would be zeros): quantise after loading.
    with pytest.raises(UserError, match=r"load the weights into the float model, then keras_vit.quantize"):
        keras_vit.load_weights(quantized, checkpoint_params(model))
    from keras_vit.export.features import export_features

    with pytest.raises(UserError, match="TFLite has no kernels for a int4 model's feature maps"):
        export_features(quantized, tmp_path / "f", formats=("tflite",))


@pytest.fixture(scope="module")
def quantized_runs(digits_run, tmp_path_factory):
    """quantized_runs(mode): `keras-vit quantize` of the shared digits run (int8: compared on 200
    held-out digits), made once per file."""
    runs = {}

    def get(mode):
        if mode not in runs:
            runs[mode] = tmp_path_factory.mktemp("quantized") / mode
            data = ["--data", "mnist", "--num-images", "200"] if mode == "int8" else []
            assert main(["quantize", str(digits_run), "--mode", mode, "--out", str(runs[mode]), *data]) == 0
        return runs[mode]

    return get


@pytest.fixture
def quantized_run(quantized_runs):
    return quantized_runs("int8")


@pytest.mark.slow
def test_quantize_writes_a_run_folder_with_its_report(quantized_run, digits_run, capsys):
    report = json.loads((quantized_run / "quantization.json").read_text())
    assert report["mode"] == "int8" and report["agreement"]["images"] == 200
    assert report["agreement"]["top1_agreement"] >= 0.95
    assert report["weights_bytes"]["int8"] < report["weights_bytes"]["float"]
    assert (quantized_run / "labels.txt").read_text() == (digits_run / "labels.txt").read_text()
    model = keras_vit.load_model(quantized_run)
    assert model.config.quantization == "int8" and model.labels == keras_vit.load_model(digits_run).labels
    assert main(["quantize", str(digits_run), "--out", str(quantized_run)]) == 2
    assert "holds files already: choose a new folder, or pass --overwrite" in capsys.readouterr().err
    assert main(["quantize", str(quantized_run), "--mode", "int4", "--out", str(quantized_run), "--overwrite"]) == 2
    assert "is the source itself" in capsys.readouterr().err and (quantized_run / "model.keras").exists()
    assert main(["quantize", str(digits_run), "--out", str(quantized_run / "labels.txt")]) == 2
    assert "is a file: give a folder" in capsys.readouterr().err
    assert main(["train", "--weights", str(quantized_run), "--dataset", "mnist5k", "--workdir",
                 str(quantized_run.parent / "t")]) == 2
    assert "are int8, and integer weights do not train: fine-tune them with LoRA (add --lora-rank 8: QLoRA)" in (
        capsys.readouterr().err)


@pytest.mark.slow
def test_a_quantized_run_predicts_and_exports_integer_weights_validated(quantized_run, tmp_path, capsys):
    from keras_vit.export.data import mnist_digits

    digits = mnist_digits(split="test").take(0, 3)
    for i, image in enumerate(digits.images):
        from PIL import Image

        Image.fromarray(image[..., 0].astype(np.uint8)).save(tmp_path / f"{i}.png")
    assert main(["predict", str(quantized_run), *(str(tmp_path / f"{i}.png") for i in range(3))]) == 0
    capsys.readouterr()
    out = tmp_path / "exports"
    assert main(["export", str(quantized_run), "--out", str(out), "--data", "mnist", "--num-validation", "64",
                 "--latency-runs", "1", "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = {row["format"]: row for row in report["artifacts"]}
    assert set(rows) == {"saved_model", "tflite", "onnx"} and all(row["passed"] for row in rows.values())
    assert set(report["skipped"]) == {"tflite-fp16", "tflite-dynamic", "tflite-int8"}
    assert rows["tflite"]["notes"]["quantization"].endswith("from the model's int8 weights")
    import tensorflow as tf

    served = tf.saved_model.load(str(out / "int8" / "1"))
    assert {v.dtype for v in served.variables if v.name.endswith("kernel:0")} == {tf.int8, tf.float32}
    assert main(["export", str(quantized_run), "--out", str(tmp_path / "e2"), "--formats", "tflite-int8",
                 "--data", "mnist"]) == 2
    assert "tflite-int8 does not take a quantised (int8) model" in capsys.readouterr().err


@pytest.mark.slow
def test_an_int4_run_evaluates_predicts_and_exports_validated(quantized_runs, digits_run, tmp_path, capsys):
    """An int4 run as any run: evaluate, predict, and a SavedModel holding the packed int4 kernels
    (two a byte, as int8) and a TFLite file, each validated against the int4 Keras model."""
    import tensorflow as tf
    from PIL import Image

    from keras_vit.export.data import mnist_digits

    quantized_run = quantized_runs("int4")
    assert main(["evaluate", str(quantized_run), "mnist", "--num-images", "100"]) == 0
    assert "on 100 images of mnist (10 classes): top-1" in capsys.readouterr().out
    Image.fromarray(mnist_digits(split="test").images[0, ..., 0].astype(np.uint8)).save(tmp_path / "0.png")
    assert main(["predict", str(quantized_run), str(tmp_path / "0.png")]) == 0
    out = tmp_path / "exports"
    assert main(["export", str(quantized_run), "--out", str(out), "--formats", "saved_model,tflite", "--data",
                 "mnist", "--num-validation", "32", "--latency-runs", "1", "--quiet"]) == 0
    rows = {row["format"]: row for row in json.loads((out / "report.json").read_text())["artifacts"]}
    assert set(rows) == {"saved_model", "tflite"} and all(row["passed"] for row in rows.values())
    assert rows["tflite"]["notes"]["quantization"].endswith("from the model's int4 weights")
    served = tf.saved_model.load(str(out / "int4" / "1"))
    packed = {v.name[:-2]: tuple(v.shape) for v in served.variables
              if v.dtype == tf.int8 and v.name.endswith("kernel:0")}
    floats = {w.path: tuple(w.shape) for w in keras_vit.load_model(digits_run).weights}
    mlp = [name for name in packed if "MlpBlock" in name]  # two int4 values a byte, along the outputs
    assert mlp and all(packed[name] == (*floats[name][:-1], floats[name][-1] // 2) for name in mlp), packed


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.slow
def test_lora_on_a_quantized_run_trains_the_updates_and_merges_over_the_integer_base(mode, quantized_runs, tmp_path,
                                                                                      capsys):
    """QLoRA: `train --weights <quantised run> --lora-rank R` (the scratch recipe: AdamW, whose
    weight decay reads the key table). The base's integers stay as they were (each merged kernel
    is the base's dequantised kernel plus alpha/r A B from the adapter), gradients reach the first
    block's updates through the quantised layers, and load_adapter rebuilds model.keras from the
    base and the adapter."""
    from tests.test_cli import TRAIN

    from keras_vit.runs.adapter import read_adapter
    from keras_vit.training import load_adapter

    quantized_run = quantized_runs(mode)
    if mode == "int8":  # refused before the data is read
        assert main([*TRAIN, "--weights", str(quantized_run), "--lora-rank", "2", "--precision", "mixed_float16",
                     "--workdir", str(tmp_path / "f16")]) == 2
        assert "An int8 base cannot run under --precision mixed_float16" in capsys.readouterr().err
    workdir = tmp_path / "qlora"
    assert main([*TRAIN, "--weights", str(quantized_run), "--lora-rank", "2", "--steps", "2",
                 "--workdir", str(workdir)]) == 0
    merged, base = keras_vit.load_model(workdir), keras_vit.load_model(quantized_run)
    assert merged.config.quantization is None and not merged.config.lora_rank
    tensors, _, _ = read_adapter(workdir)
    first = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query"
    assert np.any(tensors[f"{first}/lora_b"])  # B starts at zero: a gradient reached it
    plain = dequantized(base)
    expected = (np.asarray(variables_by_key(plain)[f"{first}/kernel"])
                + (tensors[f"{first}/lora_a"] @ tensors[f"{first}/lora_b"]).reshape(-1, *plain.encoder.blocks[0]
                                                                                    .attention.query.kernel.shape[1:]))
    np.testing.assert_allclose(np.asarray(variables_by_key(merged)[f"{first}/kernel"]), expected, atol=1e-6)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(load_adapter(workdir)(images)), np.asarray(merged(images)), atol=1e-5)
