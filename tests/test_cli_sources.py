"""Issue #22 on the command line: labels that travel with the model (3), image
inputs that say why nothing was read (4), any from_pretrained source as MODEL
(5), exports replaced as a whole (6), default formats the installation can
write (8)."""

import contextlib
import io
import json
import shutil
import sys
import zipfile

import numpy as np
import pytest
import transformers
from PIL import Image

import keras_vit
from keras_vit import runs
from keras_vit.cli import main
from keras_vit.export import FORMATS
from keras_vit.export import tflite
from tests.conftest import tiny_config
from tests.image_files import picture
from tests.sources_helpers import perturb_torch

COLOURS = ["red", "green", "blue"]
SIZE = 32


def one_error_line(err, command):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"keras-vit {command}: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A directory written by transformers' own save_pretrained, with three class names."""
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    image_size=SIZE, patch_size=8, num_labels=3,
                                    id2label=dict(enumerate(COLOURS)), label2id={c: i for i, c in enumerate(COLOURS)})
    hf = transformers.ViTForImageClassification(config).eval()
    perturb_torch(hf, 1)
    path = tmp_path_factory.mktemp("checkpoints") / "colours"
    hf.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("photos") / "photo.png"
    Image.fromarray(picture(SIZE, SIZE)).save(path)
    return path


def predicted_labels(out):
    return {line.split("  ")[-1].strip() for line in out.splitlines() if line.startswith("  ")}


# --- 3. labels belong to the model ----------------------------------------------------------------------------

@pytest.mark.slow
def test_labels_survive_keras_save_and_reach_every_export_22_3(hf_dir, photo, tmp_path, capsys):
    """#22.3: from_pretrained's labels stay in the .keras file and reach predict, SavedModel, TFLite and HF."""
    model = keras_vit.from_pretrained(str(hf_dir))
    assert model.labels == COLOURS
    model.save(tmp_path / "m.keras")
    assert keras_vit.load_model(tmp_path / "m.keras").labels == COLOURS

    assert main(["predict", str(tmp_path / "m.keras"), str(photo), "--top", "3"]) == 0
    assert predicted_labels(capsys.readouterr().out) == set(COLOURS)

    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "m.keras"), "--formats", "saved_model,tflite,hf", "--out", str(out),
                 "--latency-runs", "1"]) == 0
    capsys.readouterr()
    written = json.loads((out / "m-hf" / "config.json").read_text())
    assert written["id2label"] == {"0": "red", "1": "green", "2": "blue"}
    assert (out / "labels.txt").read_text().split() == COLOURS
    assert (out / "m" / "1" / "assets" / "labels.txt").read_text().split() == COLOURS  # top_k_labels' table
    assert tflite.read_labels((out / "m.tflite").read_bytes()) == COLOURS


@pytest.mark.slow
def test_old_keras_files_and_run_folders_keep_their_labels_22_3(hf_dir, photo, tmp_path, capsys):
    """#22.3: a .keras file saved before labels were in the config still loads (its workdir's labels.txt
    names the classes); a run folder's model.keras takes the run's labels.txt, not a checkpoint's."""
    model = keras_vit.from_pretrained(str(hf_dir))
    old = tmp_path / "old" / "model.keras"
    old.parent.mkdir()
    model.save(old)
    _drop_labels_from_config(old)
    assert keras_vit.load_model(old).labels is None
    (old.parent / "labels.txt").write_text("cat\ndog\nfish\n")
    assert main(["predict", str(old.parent), str(photo), "--top", "3"]) == 0
    assert predicted_labels(capsys.readouterr().out) == {"cat", "dog", "fish"}

    run = tmp_path / "run"
    run.mkdir()
    runs.write_labels(run, ["cat", "dog", "fish"], 3)  # a fine-tuning run on another 3-class dataset
    runs.save_model(run, model)
    assert keras_vit.load_model(run).labels == ["cat", "dog", "fish"]


def _drop_labels_from_config(path):
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(files["config.json"])
    del config["config"]["labels"]
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)


# --- 4. why no image was read ---------------------------------------------------------------------------------

def test_predict_and_inspect_say_why_no_image_was_read_22_4(hf_dir, photo, tmp_path, capsys):
    """#22.4: a folder of class sub-folders (add --recursive), an empty folder, a missing file and a text file
    each give one error line saying which, exit 2."""
    train = tmp_path / "train"
    for name in COLOURS:
        (train / name).mkdir(parents=True)
        Image.open(photo).save(train / name / "1.png")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not an image")
    cases = {str(train): "no image directly inside, 3 in 3 sub-folder(s): add --recursive",
             str(tmp_path / "empty"): "a folder without image files (.jpg",
             str(tmp_path / "missing.png"): "no such file",
             str(tmp_path / "notes.txt"): "not an image"}
    for path, why in cases.items():
        assert main(["predict", str(hf_dir), path]) == 2
        line = one_error_line(capsys.readouterr().err, "predict")
        assert f"no image could be read: {path}: {why}" in line, line
    assert main(["inspect", str(hf_dir), "--image", str(train), "--out", str(tmp_path / "figures")]) == 2
    assert cases[str(train)] in one_error_line(capsys.readouterr().err, "inspect")

    assert main(["predict", str(hf_dir), str(train), "--recursive"]) == 0
    assert capsys.readouterr().out.count("1.png") == 3
    # One read: the folder is skipped, said why, and counted in the exit status (#37 item 10).
    assert main(["predict", str(hf_dir), str(photo), str(train)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(str(photo)) and f"skipped {train}: no image directly inside" in err
    assert err.strip().splitlines()[-1] == "keras-vit predict: 1 of 2 inputs failed (named above); the others were predicted."


# --- 5. any from_pretrained source is a model ------------------------------------------------------------------

@pytest.mark.slow
def test_a_checkpoint_is_a_model_to_every_command_22_5(hf_dir, photo, tmp_path, capsys, monkeypatch):
    """#22.5: an HF directory, and hf:ORG/NAME, are MODEL to predict, inspect and export."""
    assert main(["predict", str(hf_dir), str(photo), "--top", "3"]) == 0
    assert predicted_labels(capsys.readouterr().out) == set(COLOURS)
    assert main(["inspect", str(hf_dir), "--image", str(photo), "--out", str(tmp_path / "figures"),
                 "--dpi", "30"]) == 0
    assert (tmp_path / "figures" / "rollout.png").exists()
    # TFLite, the quickest format to write (a SavedModel takes ~3x as long): the source's labels are resolved
    # once for every format, and that each format carries them is 22_3's test.
    assert main(["export", str(hf_dir), "--formats", "tflite", "--out", str(tmp_path / "a"),
                 "--latency-runs", "1"]) == 0
    assert "[export] checkpoint " in capsys.readouterr().out
    assert tflite.read_labels((tmp_path / "a" / "colours.tflite").read_bytes()) == COLOURS

    from keras_vit.weights import download

    monkeypatch.setattr(download, "hf_directory", lambda repo, revision=None: str(hf_dir))  # no network in tests
    assert main(["predict", "hf:acme/colours", str(photo), "--top", "1"]) == 0
    assert predicted_labels(capsys.readouterr().out) <= set(COLOURS)

    assert main(["predict", str(tmp_path / "nothing"), str(photo)]) == 2
    line = one_error_line(capsys.readouterr().err, "predict")
    assert "does not exist and names no checkpoint: give a run folder, a .keras file, a checkpoint folder" in line
    (tmp_path / "plain").mkdir()
    assert main(["export", str(tmp_path / "plain"), "--formats", "tflite", "--out", str(tmp_path / "b")]) == 2
    line = one_error_line(capsys.readouterr().err, "export")
    assert "neither a run folder nor a checkpoint folder" in line


# --- 8. the default formats are what the installation can write; 6. an export is replaced as a whole, or not at all

@pytest.fixture(scope="module")
def default_export(tmp_path_factory):
    """`keras-vit export MODEL` with the default formats, the onnx extra missing: built once, read by #22.8's
    test and, copied, the existing export #22.6's test refuses to overwrite and then replaces (exporting
    every default format costs a minute; each test exporting its own doubled it)."""
    model = keras_vit.ViT(tiny_config(), image_size=8, num_classes=3, num_channels=1)
    model.head.bias.assign(np.array([0.0, 1.0, 2.0], np.float32))  # a constant answer: every format agrees
    model_file = tmp_path_factory.mktemp("models") / "tiny.keras"  # alone in its folder (#22.6 exports into it)
    model.save(model_file)
    images = tmp_path_factory.mktemp("data") / "images.npy"
    np.save(images, np.random.default_rng(0).uniform(0, 255, (24, 8, 8, 1)).astype(np.float32))
    out = tmp_path_factory.mktemp("exports") / "out"
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout):
        patch.setitem(sys.modules, "tf2onnx", None)  # `import tf2onnx` now raises ImportError
        code = main(["export", str(model_file), "--out", str(out), "--data", str(images), "--num-calibration", "8",
                     "--latency-runs", "1"])
    return model_file, out, code, stdout.getvalue()


@pytest.mark.slow
def test_default_formats_skip_a_missing_extra_22_8(default_export):
    """#22.8: without the onnx extra the default export writes every other format and says, in one line,
    which was skipped and the pip command that adds it."""
    _, out, code, printed = default_export
    assert code == 0, printed[-3000:]
    (skipped,) = [line for line in printed.splitlines() if "skipped" in line]
    assert skipped.startswith("[export] onnx skipped") and 'pip install "keras-vision-transformer[onnx]"' in skipped, skipped
    report = json.loads((out / "report.json").read_text())
    assert [row["format"] for row in report["artifacts"]] == [f for f in FORMATS if f != "onnx"]
    assert report["passed"] and list(report["skipped"]) == ["onnx"]
    assert not list(out.glob("*.onnx"))


@pytest.mark.slow
def test_an_existing_export_is_refused_or_replaced_as_a_whole_22_6(default_export, tmp_path, capsys):
    """#22.6: a folder holding an export is refused without --overwrite and replaced as one unit with it;
    --out naming a file, or a folder of other files, is refused in words."""
    model_file, exported, code, _ = default_export
    assert code == 0
    out = tmp_path / "out"
    shutil.copytree(exported, out)  # an export of saved_model (version 1) and four TFLite files
    entries = sorted(p.name for p in out.iterdir())
    assert entries[:3] == ["labels.txt", "report.json", "tiny"] and len(entries) == 7, entries
    assert [p.name for p in (out / "tiny").iterdir()] == ["1"]
    export = ["export", str(model_file), "--out", str(out), "--latency-runs", "1"]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    assert main([*export, "--formats", "saved_model"]) == 2
    line = one_error_line(capsys.readouterr().err, "export")
    assert (f"--out {out} already holds an export ({', '.join(entries[:4])} and 3 more): "
            f"add --overwrite") in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    assert main([*export, "--formats", "saved_model", "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["labels.txt", "report.json", "tiny"]  # no stale .tflite
    assert [p.name for p in (out / "tiny").iterdir()] == ["2"]  # the next version (TF Serving loads it), alone
    report = json.loads((out / "report.json").read_text())
    assert [row["format"] for row in report["artifacts"]] == ["saved_model"]

    capsys.readouterr()
    for target, words in ((model_file, f"--out {model_file} is not a folder: give a folder"),
                          (model_file / "sub", f"is not a folder ('{model_file}' is a file)"),
                          (model_file.parent, "holds files that are not an export (tiny.keras): export into a new")):
        assert main(["export", str(model_file), "--formats", "tflite", "--out", str(target), "--overwrite"]) == 2
        line = one_error_line(capsys.readouterr().err, "export")
        assert words in line and "Errno" not in line, line
