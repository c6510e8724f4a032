"""One writer per workdir (issue #37 item 1): the lock, its stale owners, and multi-worker roles."""

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from keras_vit.cli import main
from keras_vit.utils import locks
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
    workdir = tmp_path / "run"
    _lock(workdir, 1, host="elsewhere.example")
    with pytest.raises(locks.WorkdirBusy, match="elsewhere.example"):
        locks.acquire(str(workdir))


def test_a_lock_naming_this_process_is_live_only_while_this_process_holds_it(tmp_path):
    """A restarted container's pid 1, or a pid reused after a reboot, may be ours:
    the lock names it, but this process never took it (another token)."""
    owner = locks.acquire(str(tmp_path / "run"))
    assert not locks.is_stale(owner)
    assert locks.is_stale({**owner, "token": "a predecessor's"})
    assert locks.is_stale({"host": socket.gethostname(), "pid": os.getpid()})  # an older lock, no token
    locks.release(str(tmp_path / "run"), owner)
    assert locks.is_stale(owner)


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc (host and pid decide)")


@needs_proc
def test_a_live_pid_started_at_another_time_or_boot_is_a_reused_pid(tmp_path):
    parent = {**locks.this_process(), "pid": os.getppid(), "proc_start": locks._process_start(os.getppid())}
    assert not locks.is_stale(parent)  # the live owner itself
    assert locks.is_stale({**parent, "proc_start": parent["proc_start"] + 1})  # another process, same pid
    if locks._boot_id():
        assert locks.is_stale({**parent, "boot_id": "another-boot"})  # its process died with that boot
    workdir = tmp_path / "run"
    _lock(workdir, os.getppid())
    (workdir / locks.LOCK_FILE).write_text(json.dumps({**parent, "proc_start": parent["proc_start"] + 1}))
    with locks.held(str(workdir)):  # kill -9 resume, the pid now someone else's
        assert locks.read(str(workdir))["pid"] == os.getpid()


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="no pid namespaces here")
def test_a_lock_of_another_pid_namespace_is_refused_as_another_hosts(tmp_path):
    """Containers on the host's network share its hostname: their pids mean nothing here."""
    workdir = tmp_path / "run"
    _lock(workdir, _dead_pid())
    other = {**locks.read(str(workdir)), "pid_ns": locks._pid_namespace() + 1}
    (workdir / locks.LOCK_FILE).write_text(json.dumps(other))
    assert not locks.is_stale(other)
    with pytest.raises(locks.WorkdirBusy, match=f"another container.*delete its {locks.LOCK_FILE}"):
        locks.acquire(str(workdir))


def test_the_lock_appears_with_its_content(tmp_path, monkeypatch):
    """Created empty and written after, a reader in between saw {} and took it over."""
    seen = []
    link = os.link

    def recording_link(src, dst):
        seen.append(json.loads(open(src).read()))
        link(src, dst)

    monkeypatch.setattr(os, "link", recording_link)
    owner = locks.acquire(str(tmp_path / "run"))
    assert seen == [owner]
    assert os.listdir(tmp_path / "run") == [locks.LOCK_FILE]  # the temporary name is gone


def test_without_hard_links_the_lock_is_created_exclusively(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    owner = locks.acquire(str(tmp_path / "run"))
    assert locks.read(str(tmp_path / "run")) == owner
    assert os.listdir(tmp_path / "run") == [locks.LOCK_FILE]
    with pytest.raises(locks.WorkdirBusy):
        locks.acquire(str(tmp_path / "run"))


def test_an_unparsable_lock_is_being_written_while_young_and_stale_when_old(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / locks.LOCK_FILE).write_text("")  # O_EXCL done, the content not yet written
    with pytest.raises(locks.WorkdirBusy, match="being written"):
        locks.acquire(str(workdir))
    old = time.time() - locks.FRESH_S - 5
    os.utime(workdir / locks.LOCK_FILE, (old, old))
    with locks.held(str(workdir)):
        assert locks.read(str(workdir))["pid"] == os.getpid()


def test_a_workdir_that_cannot_take_the_lock_is_removed_with_the_parents_made_for_it(tmp_path, monkeypatch):
    def full_disk(path, text, flags):
        open(path, "w").close()  # created, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(locks, "_write_synced", full_disk)
    with pytest.raises(locks.UserError, match="No space left"):
        locks.acquire(str(tmp_path / "a" / "b" / "run"))
    assert os.listdir(tmp_path) == []


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


@pytest.mark.parametrize("cluster, task", [
    ({"chief": ["h0:0"], "worker": ["h1:1", "h2:2"]}, ("chief", 0)),
    ({"chief": ["h0:0"], "worker": ["h1:1", "h2:2"]}, ("worker", 0)),
    ({"chief": ["h0:0"], "worker": ["h1:1", "h2:2"]}, ("worker", 1)),
    ({"chief": ["h0:0"], "worker": ["h1:1"], "evaluator": ["h9:9"]}, ("evaluator", 0)),
    ({"worker": ["h1:1", "h2:2"]}, ("worker", 0)),
    ({"worker": ["h1:1", "h2:2"]}, ("worker", 1)),
    ({"worker": ["h1:1"], "evaluator": ["h9:9"]}, ("evaluator", 0)),
])
def test_writer_role_agrees_with_the_trainers_chief_rule(cluster, task, monkeypatch):
    """The lock's writer (read without TensorFlow) must be the process the trainer
    lets write: is_chief, asked of a strategy over the same TF_CONFIG."""
    import tensorflow as tf

    from keras_vit.training import strategies

    class FakeMultiWorker(tf.distribute.MultiWorkerMirroredStrategy):
        def __init__(self, resolver):  # no cluster to join: only what is_chief asks
            self._fake_resolver = resolver

        cluster_resolver = property(lambda self: self._fake_resolver)

    tf_config = json.dumps({"cluster": cluster, "task": {"type": task[0], "index": task[1]}})
    monkeypatch.setenv("TF_CONFIG", tf_config)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    chief = strategies.is_chief(FakeMultiWorker(resolver))
    assert locks.writer_role("multi_worker", {"TF_CONFIG": tf_config}) is chief
    assert locks.writer_role("auto", {"TF_CONFIG": tf_config}) is chief
