"""One writer per workdir (issue #37 item 1): the lock, its stale owners, and multi-worker roles."""

import json
import os
import socket
import subprocess
import sys

import pytest

from keras_vit.cli import main
from keras_vit import locks
from tests.test_cli import TRAIN, _one_error_line


def _lock(workdir, pid, host=None):
    workdir.mkdir(parents=True, exist_ok=True)
    owner = {"host": host or socket.gethostname(), "pid": pid, "started": "2024-01-01T00:00:00"}
    (workdir / locks.LOCK_FILE).write_text(json.dumps(owner))
    return owner


def _dead_pid():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)  # that process has exited: as after kill -9


def test_a_second_run_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys):
    workdir = tmp_path / "run"
    _lock(workdir, os.getppid())  # a live process of this host holds it
    assert main([*TRAIN, "--steps", "2", "--workdir", str(workdir)]) == 2
    line = _one_error_line(capsys.readouterr().err, "train")
    assert str(workdir) in line and f"pid {os.getppid()}" in line, line
    assert len(line.replace(str(workdir), "W")) < 300, line
    assert sorted(os.listdir(workdir)) == [locks.LOCK_FILE]  # nothing written, the lock left alone


def test_the_lock_is_released_on_an_exception_and_a_created_workdir_removed(tmp_path):
    workdir = str(tmp_path / "new")
    with pytest.raises(KeyboardInterrupt):
        with locks.held(workdir):
            assert os.path.exists(os.path.join(workdir, locks.LOCK_FILE))
            raise KeyboardInterrupt
    assert not os.path.exists(workdir)  # created for the run, left empty: gone


def test_a_lock_of_a_killed_process_is_taken_over(tmp_path):
    workdir = tmp_path / "run"
    _lock(workdir, _dead_pid())
    (workdir / "keep.txt").write_text("a file of the earlier run")
    with locks.held(str(workdir)):
        assert locks.read(str(workdir))["pid"] == os.getpid()
    assert sorted(os.listdir(workdir)) == ["keep.txt"]


def test_an_unreadable_lock_is_stale_and_another_hosts_is_not(tmp_path):
    assert locks.is_stale({})
    assert not locks.is_stale({"host": "elsewhere.example", "pid": 1})
    assert not locks.is_stale({"host": socket.gethostname(), "pid": os.getpid()})
    workdir = tmp_path / "run"
    _lock(workdir, 1, host="elsewhere.example")
    with pytest.raises(locks.WorkdirBusy, match="elsewhere.example"):
        locks.acquire(str(workdir))


def test_a_lock_taken_over_by_another_run_is_not_released_by_the_first(tmp_path):
    workdir = tmp_path / "run"
    owner = locks.acquire(str(workdir))
    newer = _lock(workdir, os.getppid())
    locks.release(str(workdir), owner)
    assert locks.read(str(workdir)) == newer


def _tf_config(task_type, index, chief=True):
    cluster = {"worker": ["h1:1", "h2:2"], **({"chief": ["h0:0"]} if chief else {})}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


@pytest.mark.parametrize("environ, writer", [
    ({}, True),
    (_tf_config("chief", 0), True),
    (_tf_config("worker", 0), False),                 # a chief exists: worker 0 only reads
    (_tf_config("worker", 0, chief=False), True),     # no chief: worker 0 is it
    (_tf_config("worker", 1, chief=False), False),
    (_tf_config("evaluator", 0), False),
])
def test_the_workers_of_one_multi_worker_run_are_one_writer(environ, writer, tmp_path):
    assert locks.writer_role("multi_worker", environ) is writer
    workdir = tmp_path / "run"
    _lock(workdir, os.getppid())  # the chief holds it
    if writer:
        with pytest.raises(locks.WorkdirBusy):
            locks.acquire(str(workdir))
    else:
        with locks.held(str(workdir), writer=False):  # a worker of the same run goes on
            pass


def test_a_single_process_strategy_ignores_tf_config():
    assert locks.writer_role("one_device", _tf_config("worker", 1))
