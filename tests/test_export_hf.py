"""`export --formats hf`: an HF transformers directory, validated in a fresh
process by transformers itself; and ONNX's one-line refusal of the exact GELU."""

import json

import pytest

import keras_vit
from keras_vit.export import ExportError, export
from tests.sources_helpers import perturb_keras

CONFIG = keras_vit.ViTConfig(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                             gelu_approximate=False, layer_norm_epsilon=1e-12)


@pytest.mark.slow
def test_cli_formats_hf_is_validated_by_transformers(tmp_path, capsys):
    from keras_vit import cli

    model = keras_vit.ViT(CONFIG, image_size=32, num_classes=3, include_preprocessing=True, name="pets")
    perturb_keras(model, 3)
    workdir = tmp_path / "run"
    workdir.mkdir()
    model.save(workdir / "model.keras")
    (workdir / "labels.txt").write_text("cat\ndog\nfish\n")
    assert cli.main(["export", str(workdir), "--formats", "hf", "--out", str(tmp_path / "out"),
                     "--latency-runs", "2"]) in (0, None)
    assert "hf: validating in a fresh process" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (row,) = report["artifacts"]
    assert row["passed"] and row["installed"] and row["max_abs_diff"] <= 1e-4, row
    assert row["path"] == str(tmp_path / "out" / "run-hf")  # named after the workdir
    written = json.loads((tmp_path / "out" / "run-hf" / "config.json").read_text())
    assert written["id2label"] == {"0": "cat", "1": "dog", "2": "fish"} and written["hidden_act"] == "gelu"


def test_hf_export_refuses_what_hf_cannot_express(tmp_path):
    model = keras_vit.ViT(CONFIG.replace(classifier="gap"), image_size=32, num_classes=3)
    with pytest.raises(ExportError, match="hf: .*classifier='gap'"):
        export(model, "hf", str(tmp_path / "out"), verbose=False)


def test_onnx_refuses_the_exact_gelu_in_one_line(tmp_path):
    pytest.importorskip("tf2onnx")
    model = keras_vit.ViT(CONFIG, image_size=32, num_classes=3)
    with pytest.raises(ExportError) as error:
        export(model, "onnx", str(tmp_path / "out"), verbose=False)
    message = str(error.value)
    assert "\n" not in message and "exact GELU" in message and "gelu_approximate=True" in message


def test_a_format_that_cannot_take_the_model_names_the_formats_that_can(tmp_path):
    """A distilled DeiT has no HF ViT form (#37 item 10: the refusal named no format that works)."""
    pytest.importorskip("transformers")
    deit = keras_vit.ViT(CONFIG.replace(distillation_token=True, distillation_head=True), image_size=32,
                         num_classes=3)
    with pytest.raises(ExportError, match=r"^hf: .*distillation token\. These formats take it: "
                                          r"formats=\['saved_model'") as error:
        export(deit, "hf", str(tmp_path / "out"), verbose=False)
    assert "hf'" not in str(error.value).split("take it:")[1] and not (tmp_path / "out").exists()
