"""The `keras-vit` command line: instant help, one-line errors, run folders (issues #13, #16)."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_vit.utils import storage
from keras_vit.cli import COMMANDS, main
from keras_vit.errors import CannotContinue, MissingExtra, UserError
from tests.conftest import copy_run
from tests.training_helpers import checkpoint_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Nano/4 (one block) on 7x7 patches: a few milliseconds a step, a second or two of tracing.
TRAIN = ["train", "--model", "Nano/4", "--patch-size", "7", "--recipe", "scratch", "--dataset", "mnist5k",
         "--batch-size", "16", "--train-augment", "none", "--warmup-steps", "0", "--eval-batch-size", "500",
         "--no-jit", "--strategy", "default", "--no-progress"]


def _env():
    # As a user runs it: no TF_CPP_MIN_LOG_LEVEL of the test session's.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, "PYTHONPATH": ROOT}


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "keras_vit_cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=_env())


def _one_error_line(err, command):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"keras-vit {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def finished(digits_run):
    """A finished run of TRAIN, 2 steps, checkpointed at step 2: conftest's digits_run, shared with other
    files (read only: a test that trains on it works on a copy)."""
    return digits_run


# --- help without TensorFlow (#16 item 7) -------------------------------------------------------------------

def test_help_of_every_command_imports_neither_keras_nor_tensorflow():
    script = ("import sys\nfrom keras_vit_cli import main\n"
              "for argv in [['--help']] + [[c, '--help'] for c in sys.argv[1:]]:\n"
              "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code == 0, argv\n"
              "print('LOADED', sorted(m for m in ('tensorflow', 'keras', 'jax', 'torch') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script, *COMMANDS], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "LOADED []"
    for command in COMMANDS:
        assert f"usage: keras-vit {command}" in done.stdout


# --- one-line errors (#13 item 5) ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, code, pattern", [
    (["nonsense"], 2, r"keras-vit: error: unknown command 'nonsense'"),
    (["train", "--model", "X/9", "--workdir", "w"], 2, r"--model: Unknown ViT variant 'X/9'. Known variants"),
    (["train", "--batch-size", "0", "--workdir", "w"], 2, r"--batch-size: must be a positive integer, got 0"),
    (["train", "--image-size", "0", "--workdir", "w"], 2, r"--image-size: must be a positive integer, got 0"),
    (["train", "--steps", "many", "--workdir", "w"], 2, r"--steps: expected an integer, got 'many'"),
    (["train"], 2, r"the following arguments are required: --workdir"),
    (["train", "--model", "Mu/4", "--weights", "no/such/run", "--workdir", "w"], 2,
     r"--weights no/such/run does not exist"),
    (["train", "--recipe", "fast", "--workdir", "w"], 2, r"--recipe: invalid choice: 'fast'"),
    (["predict", "missing.keras", "a.png"], 2, r"Model file 'missing.keras' does not exist"),
    (["predict", "m.keras", "a.png", "--top", "0"], 2, r"--top: must be a positive integer"),
    (["inspect", "missing.keras", "--image", "a.png"], 2, r"Model file 'missing.keras' does not exist"),
    (["export", "missing.keras", "--formats", "tflite"], 2, r"does not exist"),
    (["export", "B/16", "--formats", "coreml"], 2, r"Unknown export format"),
    (["demo", "--steps", "-1"], 2, r"--steps: must be 0 or more"),
    (["demo", "--precision", "bf16", "--no-export"], 2, r"precision must be one of \('auto', 'float32'"),
    (["variants", "extra"], 2, r"unrecognized arguments: extra"),
])
def test_user_errors_are_one_line(argv, code, pattern, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == code
    captured = capsys.readouterr()
    line = _one_error_line(captured.err, argv[0] if argv[0] in COMMANDS else "")if argv[0] in COMMANDS else \
        captured.err.strip()
    assert re.search(pattern, line), line
    assert not (tmp_path / "w").exists()  # rejected before any work


# --- errors vs bugs (#23 item 6) ----------------------------------------------------------------------------

def _failing_variants(monkeypatch, error):
    """`keras-vit variants` (no TensorFlow) whose run raises `error`."""
    from keras_vit.cli import variants as cli_variants

    def run(args):
        raise error

    monkeypatch.setattr(cli_variants, "run", run)


@pytest.mark.parametrize("error, code", [
    (UserError("--size: bad value; use 3"), 2),
    (MissingExtra('TFLite export needs ai_edge_litert: pip install "keras-vision-transformer[tflite]"'), 2),
    (CannotContinue("out of memory: use a smaller batch"), 1),
    (PermissionError(13, "Permission denied", "/root/out"), 1),
    (FileNotFoundError(2, "No such file or directory", "photos.csv"), 1),
])
def test_known_failures_are_one_line_with_their_exit_status(error, code, monkeypatch, capsys):
    _failing_variants(monkeypatch, error)
    assert main(["variants"]) == code
    line = _one_error_line(capsys.readouterr().err, "variants")
    assert line == f"keras-vit variants: error: {error}"
    assert main(["variants", "--debug"]) == code  # --debug adds the traceback
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == line


@pytest.mark.parametrize("error", [TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
                                   KeyError("num_heads"), ValueError("operands could not be broadcast"),
                                   AttributeError("'NoneType' object has no attribute 'shape'"),
                                   ImportError("cannot import name 'thing' from 'keras_vit.model'")])
def test_a_bug_of_ours_shows_its_traceback_and_asks_for_a_report(error, monkeypatch, capsys):
    _failing_variants(monkeypatch, error)
    assert main(["variants"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert f"in run\n    raise error\n{type(error).__name__}" in err  # the frame that raised
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"keras-vit variants: internal error: {type(error).__name__}: ")
    assert last.endswith("This is a bug in keras_vit: please report it with the traceback above.")


def test_ctrl_c_is_exit_130(monkeypatch, capsys):
    _failing_variants(monkeypatch, KeyboardInterrupt())
    assert main(["variants"]) == 130
    assert capsys.readouterr().err == "keras-vit variants: interrupted (Ctrl-C).\n"


@pytest.mark.slow
def test_a_bug_in_a_fresh_process_exits_1_with_the_report_line(tmp_path):
    # A real process, as a user meets it: the traceback on stderr, then the line to report.
    script = ("import sys\nfrom keras_vit import cli\nfrom keras_vit.cli import variants as cli_variants\n"
              "cli_variants.run = lambda args: {}['missing']\n"
              "sys.exit(cli.main(['variants']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=_env())
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "KeyError: 'missing'" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "keras-vit variants: internal error: KeyError: 'missing'. This is a bug in keras_vit: please report it "
        "with the traceback above.")


def test_usage_errors_are_user_errors():
    from keras_vit.utils.flags import UsageError

    assert issubclass(UsageError, UserError) and issubclass(UsageError, ValueError)


@pytest.mark.slow
def test_a_fresh_process_prints_one_line_and_no_tensorflow_chatter(tmp_path):
    """TensorFlow is imported (the command runs), but its start-up lines stay out."""
    done = _cli("predict", str(tmp_path / "nope.keras"), str(tmp_path / "a.png"))
    assert done.returncode == 2
    line = _one_error_line(done.stderr, "predict")
    assert "does not exist" in line and done.stdout == ""


def test_debug_adds_the_traceback_of_a_user_error(tmp_path, capsys):
    # What --debug adds needs no fresh process (the one above is about a fresh process's start-up lines).
    assert main(["predict", str(tmp_path / "nope.keras"), str(tmp_path / "a.png"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ModelFileError" in err


def test_corrupt_keras_file_is_not_called_missing(tmp_path, capsys):
    bad = tmp_path / "model.keras"
    bad.write_bytes(b"\x00" * 100)
    for argv in (["predict", str(bad), str(tmp_path)], ["inspect", str(bad), "--image", str(tmp_path)],
                 ["export", str(bad), "--formats", "tflite", "--out", str(tmp_path / "out")]):
        assert main(argv) == 2
        line = _one_error_line(capsys.readouterr().err, argv[0])
        assert "exists but cannot be read" in line and "not found" not in line.lower(), line


def test_incompatible_workdir_and_missing_data_are_one_line(finished, tmp_path, capsys):
    assert main([*TRAIN, "--steps", "4", "--model", "Ti/16", "--patch-size", "7", "--image-size", "28",
                 "--workdir", str(copy_run(finished, tmp_path))]) == 2
    line = _one_error_line(capsys.readouterr().err, "train")
    assert "different run" in line and "new --workdir" in line
    assert main([*TRAIN, "--steps", "2", "--dataset", f"folder:{tmp_path / 'none'}",
                 "--workdir", str(tmp_path / "w")]) == 2
    _one_error_line(capsys.readouterr().err, "train")


# --- the run folder: labels, resolved settings, finished and resumed runs (#16 items 4, 9, 11) -----------

def test_a_run_folder_holds_labels_and_what_actually_ran(finished):
    """... and its model.keras carries the run's labels in its config (#22.3)."""
    import keras_vit

    assert (finished / "labels.txt").read_text().splitlines() == [str(i) for i in range(10)]
    assert keras_vit.load_model(finished / "model.keras").labels == [str(i) for i in range(10)]
    config = json.loads((finished / "config.json").read_text())
    assert config["plan"]["image_size"] == [28, 28] and config["recipe"]["image_size"] is None
    assert config["plan"]["model"]["classifier"] == "gap" and config["plan"]["num_classes"] == 10
    assert "resolved" not in config  # the plan, once (#38 item 3)
    results = json.loads((finished / "results.json").read_text())
    assert results["status"] == "finished" and results["plan"] == config["plan"]
    assert [s["end_step"] for s in results["segments"]] == [2]
    umask = os.umask(0)
    os.umask(umask)
    for path in [*(finished / "checkpoints").iterdir(), finished / "results.json", finished / "labels.txt"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask, path


def test_rerunning_a_finished_run_leaves_its_results_alone(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path)  # the shared run is read only
    before = (workdir / "results.json").read_bytes()
    assert main([*TRAIN, "--steps", "2", "--checkpoint-every", "2", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert out.count("already finished at step 2") == 1
    assert (workdir / "results.json").read_bytes() == before


@pytest.mark.slow
def test_a_resumed_run_keeps_the_history_of_its_segments(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path, "more")
    assert main([*TRAIN, "--steps", "4", "--checkpoint-every", "2", "--learning-rate", "0.003",
                 "--workdir", str(workdir)]) == 0
    results = json.loads((workdir / "results.json").read_text())
    first, second = results["segments"]
    assert (first["start_step"], first["end_step"], second["start_step"], second["end_step"]) == (0, 2, 2, 4)
    assert second["changed"] == {"recipe.learning_rate": [0.002, 0.003], "recipe.steps": [2, 4],
                                 "workdir": [str(finished), str(workdir)]}
    assert first["eval"] == json.loads((finished / "results.json").read_text())["eval"]
    assert second["eval"] == results["eval"] and results["steps"] == 4


def test_contradictions_are_rejected(finished, tmp_path, capsys):
    # The finished run's model has a "gap" classifier: a "token" one cannot come from its weights.
    argv = [a for a in TRAIN if a not in ("--model", "Nano/4", "--patch-size", "7")]
    assert main([*argv, "--recipe", "finetune", "--steps", "1", "--weights", str(finished),
                 "--classifier", "token", "--image-size", "28", "--workdir", str(tmp_path / "w")]) == 2
    line = _one_error_line(capsys.readouterr().err, "train")
    assert "--classifier token contradicts the pre-trained weights" in line
    from keras_vit.training import TrainConfig

    with pytest.raises(ValueError, match="image_size must be a positive number"):
        TrainConfig.create("scratch", image_size=0)


# --- export of a registered variant (#16 item 1) ------------------------------------------------------------

@pytest.mark.slow
def test_export_a_variant_name_with_weights(tmp_path, capsys):
    import keras_vit
    from keras_vit.export import ExportError, export
    from keras_vit.export import source as source_lib

    model = keras_vit.ViT("Nano/4", image_size=28, num_classes=10, num_channels=1)
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign(rng.normal(size=v.shape).astype("float32") * 0.05)
    npz = keras_vit.save_weights(model, str(tmp_path / "nano4.npz"))
    with pytest.raises(ExportError, match="needs weights"):  # a variant, not a missing path
        export("B/16", "tflite", str(tmp_path / "none"), verbose=False)
    source = source_lib.resolve("Nano/4", weights=npz, image_size=28, num_classes=10, num_channels=1)
    x = rng.uniform(-1, 1, (2, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(source.model(x), model(x), rtol=1e-5, atol=1e-5)
    # In this process (the export's fresh process is its validation of the artifact, still run).
    code = main(["export", "Nano/4", "--weights", npz, "--image-size", "28", "--num-classes", "10",
                 "--num-channels", "1", "--formats", "tflite", "--out", str(tmp_path / "out"), "--latency-runs", "1"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert (tmp_path / "out" / "vit.tflite").exists() or list((tmp_path / "out").glob("*.tflite"))


# --- variants and the docs agree (#16 item 11; the table moved from the README to docs/models.md in #23) ------

def test_variants_output_is_the_docs_table(capsys):
    assert main(["variants"]) == 0
    printed = capsys.readouterr().out
    page = open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8").read()
    table = page.split("$ keras-vit variants\n", 1)[1].split("```", 1)[0]
    assert printed == table
    assert "\nMu/4 " in printed


# --- Ctrl-C and checkpoint write errors (#13 item 4) --------------------------------------------------------

@pytest.mark.slow
def test_ctrl_c_checkpoints_and_resuming_equals_an_uninterrupted_run(tmp_path):
    # 20 steps: the signal comes as the first checkpoint appears, a step or two in (~0.2 s a step, each
    # checkpointed), with a wide margin before the end (was 40: ~4 s more in each of two processes).
    settings = [*TRAIN, "--steps", "20", "--checkpoint-every", "1", "--keep-checkpoints", "1",
                "--deterministic", "--dropout-rate", "0.1"]
    straight = subprocess.Popen([sys.executable, "-m", "keras_vit_cli", *settings, "--workdir",
                                 str(tmp_path / "straight")], cwd=ROOT, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    interrupted = subprocess.Popen([sys.executable, "-m", "keras_vit_cli", *settings, "--workdir",
                                    str(tmp_path / "resumed")], cwd=ROOT, env=_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoints = tmp_path / "resumed" / "checkpoints"
    deadline = time.time() + 200
    while not (checkpoints.exists() and list(checkpoints.glob("ckpt-*.npz"))) and time.time() < deadline:
        time.sleep(0.05)
    interrupted.send_signal(signal.SIGINT)
    out, err = interrupted.communicate(timeout=200)
    assert interrupted.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.match(r"keras-vit train: Ctrl-C: checkpoint of step \d+ written to .*; "
                                        r"re-run the same command to resume\.$", lines[0]), err
    stopped = int(re.search(r"step (\d+)", lines[0]).group(1))
    assert 0 < stopped < 20
    assert [p.name for p in checkpoints.iterdir()] == [f"ckpt-{stopped:08d}.npz"]
    assert json.loads((tmp_path / "resumed" / "results.json").read_text())["status"] == "interrupted"
    resumed = subprocess.run([sys.executable, "-m", "keras_vit_cli", *settings, "--workdir",
                              str(tmp_path / "resumed")], cwd=ROOT, env=_env(),
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert straight.wait(timeout=240) == 0, straight.stderr.read()[-3000:]
    a = checkpoint_arrays(checkpoints / "ckpt-00000020.npz")
    b = checkpoint_arrays(tmp_path / "straight" / "checkpoints" / "ckpt-00000020.npz")
    assert a.keys() == b.keys()
    for key in a:  # weights, dropout RNG, optimizer moments and step
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    segments = json.loads((tmp_path / "resumed" / "results.json").read_text())["segments"]
    assert [(s["start_step"], s["end_step"], s["ended"]) for s in segments] == [
        (0, stopped, "interrupted"), (stopped, 20, "finished")]


def test_a_second_ctrl_c_aborts_at_once():
    from keras_vit.training.trainer import _StopSignals

    # Python's own handler before, as in a fresh `keras-vit train` (whatever an earlier test left).
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # Python runs a signal's handler in the main thread at its next bytecode, and the kernel may
        # deliver the signal to another (TensorFlow) thread: wait in short steps, not one long sleep.
        with _StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(500):
                if stop.raised:
                    break
                time.sleep(0.01)
            assert stop.raised and stop.signum == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(500):
                    time.sleep(0.01)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    import errno

    real = storage.write_bytes
    calls = []

    def fills_up(path, write):
        calls.append(path) if str(path).endswith(".npz") else None
        if str(path).endswith(".npz") and len(calls) == 2:  # the second checkpoint: the disk is full
            def partial(f):
                write(f)
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, partial)
        return real(path, write)

    monkeypatch.setattr(storage, "write_bytes", fills_up)
    workdir = tmp_path / "run"
    assert main([*TRAIN, "--steps", "4", "--checkpoint-every", "1", "--workdir", str(workdir)]) == 1
    line = _one_error_line(capsys.readouterr().err, "train")
    assert "No space left on device" in line and "ckpt-00000001.npz) is intact" in line
    assert [p.name for p in (workdir / "checkpoints").iterdir()] == ["ckpt-00000001.npz"]
    checkpoint_arrays(workdir / "checkpoints" / "ckpt-00000001.npz")  # readable
    monkeypatch.setattr(storage, "write_bytes", real)
    assert main([*TRAIN, "--steps", "4", "--checkpoint-every", "1", "--workdir", str(workdir)]) == 0
    segments = json.loads((workdir / "results.json").read_text())["segments"]
    assert segments[-1]["start_step"] == 1 and segments[-1]["end_step"] == 4


@pytest.mark.slow
def test_an_unwritable_checkpoint_folder_is_one_line(tmp_path, capsys):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "checkpoints").write_text("a file where the folder should be")
    assert main([*TRAIN, "--steps", "2", "--checkpoint-every", "1", "--workdir", str(workdir)]) == 1
    line = _one_error_line(capsys.readouterr().err, "train")
    assert "Cannot write the checkpoint of step 1" in line and "no earlier checkpoint exists" in line


def test_version_names_the_installed_distribution_without_importing_keras():
    script = ("import sys\nfrom keras_vit_cli import main\nmain(['--version'])\n"
              "print('LOADED', sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    from importlib.metadata import version

    assert done.stdout.splitlines() == [f"keras-vit {version('keras-vision-transformer')}", "LOADED []"]


@pytest.mark.slow
def test_a_short_demo_exports_every_format_that_passes(tmp_path, capsys):
    """#30: `keras-vit demo --steps 200` (a flag the demo offers) ended in "export FAILED": the
    int8 gate was stricter than dynamic-range int8's, and its plan was chosen at the edge of
    the budget on 200 unlabelled images. The model of 200 steps is ~68% accurate: many near-ties."""
    # In this process: the defect is in the training and the int8 gate, not in a process start (a fresh one
    # cost ~10 s of importing TensorFlow); the artifacts are still validated in fresh processes by the export.
    code = main(["demo", "--steps", "200", "--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "exports"),
                 "--formats", "tflite-dynamic,tflite-int8"])
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    assert "export passed" in out and "FAILED" not in out
    report = json.loads((tmp_path / "exports" / "report.json").read_text())
    int8 = next(row for row in report["artifacts"] if row["format"] == "tflite-int8")
    assert int8["top1_agreement"] >= 0.98 and int8["accuracy_drop"] <= 0.01
