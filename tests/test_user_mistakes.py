"""A table of user mistakes through the command line, in-process (issue #37):
each ends in exit 2 and one line under ~300 characters that names the flag
or field at fault, and leaves nothing behind."""

import json
import os
import socket
import time

import numpy as np
import pytest

from keras_vit.utils import locks
from keras_vit.errors import UserError
from keras_vit.cli import main
from tests.conftest import copy_run
from tests.test_cli import TRAIN

TRAIN_2 = [*TRAIN, "--steps", "2"]


def _files(root):
    return sorted(os.path.relpath(os.path.join(folder, name), root)
                  for folder, dirs, files in os.walk(root) for name in dirs + files)


def _hf_folder(root, drop):
    """An HF ViT folder whose config.json lost the field `drop`."""
    from safetensors.numpy import save_file

    folder = root / "hf"
    folder.mkdir()
    config = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 64, "patch_size": 4, "image_size": 8}
    del config[drop]
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"vit.embeddings.cls_token": np.zeros((1, 1, 32), np.float32)}, str(folder / "model.safetensors"))
    return str(folder)


def _cut_short(root):
    """An HF ViT folder whose model.safetensors lost its last bytes (an interrupted download)."""
    folder = _hf_folder(root, drop="image_size")
    weights = os.path.join(folder, "model.safetensors")
    with open(weights, "rb") as f:
        data = f.read()
    with open(weights, "wb") as f:
        f.write(data[:-20])
    return folder


def _headless(root):
    """An HF ViTModel folder (no classifier), as keras_vit.save_pretrained writes a backbone."""
    import keras_vit

    model = keras_vit.ViT(keras_vit.get_variant("Mu/4").replace(patch_size=4), image_size=8, include_top=False)
    keras_vit.save_pretrained(model, str(root / "backbone"))
    return str(root / "backbone")


def _busy_workdir(root):
    workdir = root / "busy"
    workdir.mkdir()
    owner = {"host": socket.gethostname(), "pid": os.getppid(), "started": "2024-01-01T00:00:00"}
    (workdir / locks.LOCK_FILE).write_text(json.dumps(owner))
    return str(workdir)


def _a_file(root):
    (root / "file.txt").write_text("not a folder")
    return str(root / "file.txt")


def _unlabelled_list(root):
    """A list: CSV whose third line has an image but no label."""
    (root / "rows.csv").write_text("path,label\na.png,cat\nb.png\n")
    return f"list:{root / 'rows.csv'}"


# (argv built from the tmp folder, what the line must name). The old behaviour each row guards against is
# in issue #37 (4: weights, 5: config.json, 1: a busy workdir, 2: an unwritable --out).
MISTAKES = {
    "weights name without a slash": (lambda t: [*TRAIN_2, "--weights", "dinov22", "--workdir", f"{t}/w"],
                                     "--weights dinov22 does not exist"),
    "weights folder missing, patch size given": (
        lambda t: [*TRAIN_2, "--patch-size", "8", "--weights", "nothere_dir", "--workdir", f"{t}/w"], "--weights"),
    "unknown variant": (lambda t: [*TRAIN_2, "--model", "X/9", "--workdir", f"{t}/w"], "--model"),
    "batch of zero": (lambda t: [*TRAIN_2, "--batch-size", "0", "--workdir", f"{t}/w"], "--batch-size"),
    "workdir is a file": (lambda t: [*TRAIN_2, "--workdir", _a_file(t)], "--workdir"),
    "workdir held by a live run": (lambda t: [*TRAIN_2, "--workdir", _busy_workdir(t)], "--workdir"),
    "list row without a label": (lambda t: [*TRAIN_2, "--dataset", _unlabelled_list(t), "--workdir", f"{t}/w"],
                                 "rows.csv: line 3 ('b.png')"),
    "recipe's default size off the patch grid": (
        lambda t: [*TRAIN_2, "--recipe", "finetune", "--workdir", f"{t}/w"],
        "the finetune recipe's default image size, 384x384, is not a multiple of the model's patch (7 px): use "
        "--image-size 378,378"),
    "dataset's size off the patch grid": (lambda t: [*TRAIN_2, "--patch-size", "8", "--workdir", f"{t}/w"],
                                          "mnist5k's image size, 28x28,"),
    "config.json without hidden_size": (lambda t: ["predict", _hf_folder(t, "hidden_size"), "x.png"],
                                        "hidden_size"),
    "config.json without model_type": (lambda t: ["predict", _hf_folder(t, "model_type"), "x.png"], "model_type"),
    "model.safetensors cut short": (lambda t: ["predict", _cut_short(t), "x.png"],
                                    "model.safetensors' is damaged or cut short"),
    "predict a model without a head": (lambda t: ["predict", _headless(t), "x.png"],
                                       "nothing to predict. Fine-tune it on your classes first (keras-vit train"),
    "export a model without a head": (lambda t: ["export", _headless(t), "--out", f"{t}/exp"],
                                      "nothing to export. Fine-tune it on your classes first (keras-vit train"),
    "missing model file": (lambda t: ["predict", f"{t}/missing.keras", "x.png"], "missing.keras"),
    "export out under a file": (lambda t: ["export", f"{t}/missing.keras", "--out", f"{_a_file(t)}/exp"], "--out"),
    "export out is a mount point": (lambda t: ["export", f"{t}/missing.keras", "--out", "/"], "--out"),
    "demo out under a file, found before training": (
        lambda t: ["demo", "--steps", "1", "--workdir", f"{t}/w", "--out", f"{_a_file(t)}/exp"], "--out"),
    # Issue 53: a missing DATA exited 1 (a FileNotFoundError); LoRA without a model; --lora-alpha 0 named the field.
    "evaluate data missing": (lambda t: ["evaluate", f"{t}/missing.keras", f"{t}/nothere"],
                              "DATA T/nothere does not exist: give a folder of class sub-folders, 'mnist'"),
    "lora without a model": (
        lambda t: ["train", "--lora-rank", "4", "--dataset", "mnist5k", "--workdir", f"{t}/w"],
        "Name a model (--model B/16, for example), or give --weights that carry their own architecture"),
    "lora alpha of zero": (lambda t: [*TRAIN_2, "--lora-rank", "2", "--lora-alpha", "0", "--workdir", f"{t}/w"],
                           "--lora-alpha must be positive, got 0.0: give a positive number (the updates' scale is "
                           "alpha / rank), or leave it out to use the rank"),
    "inspect out under a file": (lambda t: ["inspect", f"{t}/missing.keras", "--image", "x.png", "--out",
                                            f"{_a_file(t)}/figures"], "--out"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_a_user_mistake_is_one_line_naming_the_culprit_and_leaves_nothing(case, tmp_path, capsys, monkeypatch):
    argv_of, named = MISTAKES[case]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = argv_of(work)
    before = _files(work)
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"keras-vit {argv[0]}: error: ") and named in line.replace(str(work), "T"), line
    assert len(line.replace(str(work), "T")) < 300, line
    assert _files(work) == before  # nothing created, nothing removed


def test_an_export_to_a_read_only_parent_fails_before_any_work(tmp_path, capsys, monkeypatch):
    """Found up front (was: after converting and validating, a raw Errno 30 on a hidden staging path)."""
    parent = tmp_path / "ro"
    parent.mkdir()
    real = os.statvfs

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly() if os.fspath(p) == str(parent) else real(p))
    assert main(["export", "B/16", "--formats", "tflite", "--out", str(parent / "exp")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("keras-vit export: error: --out ") and "read-only filesystem" in line, line
    assert os.listdir(parent) == []


# --- what a run says (#37 items 7, 8, 9, 10) -----------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(digits_run):
    """A finished run of TRAIN_2 checkpointed at step 2 (conftest's digits_run, shared with tests/test_cli.py:
    read only, a test that trains on it works on a copy)."""
    return digits_run


@pytest.mark.slow
def test_another_patch_size_names_only_the_keys_that_differ(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path)
    assert main([*TRAIN_2, "--patch-size", "4", "--workdir", str(workdir)]) == 2
    line = capsys.readouterr().err.strip()
    assert "model.patch_size: checkpoint 7, this run 4" in line and "hidden_size" not in line, line
    assert len(line.replace(str(workdir), "W")) < 400, line  # was 1.5 KB: both whole configs


@pytest.mark.slow
def test_fine_tuning_says_the_head_was_dropped_and_no_progress_keeps_the_description(finished, tmp_path, capsys):
    assert main([*TRAIN_2, "--weights", str(finished), "--workdir", str(tmp_path / "ft")]) == 0
    out, err = capsys.readouterr()
    assert "the head of the weights (10 classes) was dropped" in out and "no head" not in out + err
    assert "keras-vit train: plan: " in out  # --no-progress hides the bar only
    results = json.loads((tmp_path / "ft" / "results.json").read_text())
    assert results["images_per_sec"] is not None  # a run of one loop has a rate too
    assert not (tmp_path / "ft" / locks.LOCK_FILE).exists()


def test_a_killed_exports_staging_folder_is_removed_by_the_next_export_of_that_target(tmp_path):
    from keras_vit.export import install
    from tests.test_workdir_lock import _dead_pid

    def staging(name, pid):
        folder = tmp_path / name
        folder.mkdir()
        owner = {"host": socket.gethostname(), "pid": pid}
        (folder / install.OWNER_FILE).write_text(json.dumps(owner))
        return folder

    killed = staging(".mine.export-4ngu3e7k", _dead_pid())
    live = staging(".mine.export-live1234", os.getppid())
    other = staging(".other.export-4ngu3e7k", _dead_pid())
    assert install.remove_stale_staging(str(tmp_path / "mine")) == [str(killed)]
    assert not killed.exists() and live.exists() and other.exists()


def test_a_staging_owner_being_written_is_live_and_a_damaged_old_one_stale(tmp_path):
    from keras_vit.export import install

    fresh, old = tmp_path / ".mine.export-fresh123", tmp_path / ".mine.export-old12345"
    for folder in (fresh, old):
        folder.mkdir()
        (folder / install.OWNER_FILE).write_text("")  # unparsable: being written, or left half-written
    past = time.time() - locks.FRESH_S - 5
    os.utime(old / install.OWNER_FILE, (past, past))
    assert install.remove_stale_staging(str(tmp_path / "mine")) == [str(old)]
    assert fresh.exists()


def test_a_staging_folder_names_its_owner_whole_and_as_live(tmp_path):
    from keras_vit.export import install

    staging, _ = install.make_staging(str(tmp_path / "mine"))
    owner = json.loads((tmp_path / staging / install.OWNER_FILE).read_text())
    assert owner["pid"] == os.getpid() and sorted(os.listdir(staging)) == [install.OWNER_FILE]
    assert install.remove_stale_staging(str(tmp_path / "mine")) == []  # this live export's own
    install.discard_staging(staging, None)


def test_a_mistyped_weights_name_from_python_is_named_in_pythons_words(tmp_path):
    from keras_vit import training
    from keras_vit.training.transfer import resolve_weights

    with pytest.raises(UserError, match=r"^weights='dinov22' does not exist and names no checkpoint.*"
                                        r"available_weights"):
        resolve_weights("dinov22")
    config = training.TrainConfig.create("scratch", dataset="mnist5k", weights=str(tmp_path / "nothere_dir"),
                                         workdir=str(tmp_path / "w"), steps=1, strategy="default")
    with pytest.raises(UserError, match="nothere_dir' does not exist"):
        training.train(config)


def test_a_class_too_small_for_a_held_out_image_is_named_not_silently_unevaluated(capsys):
    from keras_vit.training.sources import files as sources

    files = {"cat": [f"c{i}.png" for i in range(12)], "rocket": ["r0.png", "r1.png", "r2.png"]}
    train, held = sources._held_out(files)
    assert held["rocket"] == [] and len(held["cat"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("keras-vit: warning: 1 class(es) have fewer than 10 images") and "rocket (3)" in line


def test_a_json_list_entry_without_a_label_is_named_not_a_key_error(tmp_path):
    from keras_vit.errors import UserError
    from keras_vit.training.sources import files as sources

    (tmp_path / "rows.json").write_text(json.dumps([{"path": "a.png", "label": 0}, {"path": "b.png"}]))
    with pytest.raises(UserError, match=r"rows.json: entry 2 \('b.png'\) is not \(image path, label\)"):
        sources._read_list(str(tmp_path / "rows.json"))
