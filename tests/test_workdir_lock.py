"""One writer per workdir (issue #37 item 1): the lock, its stale owners, and multi-worker roles;
the lease (issue #53) that lets a run of another pid namespace, container or host take over a killed run's."""

import errno
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from keras_vit.cli import main
from keras_vit.utils import locks
from tests.test_cli import TRAIN, _one_error_line


@pytest.fixture(autouse=True)
def _no_renewal_left():
    """A test that acquires without releasing leaves no thread renewing its lock for the next tests."""
    before = set(locks._renewers)
    yield
    for token in set(locks._renewers) - before:
        locks._renewers.pop(token).stop()


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
def test_a_lock_of_another_pid_namespace_without_a_lease_is_refused_as_another_hosts(tmp_path):
    """Containers on the host's network share its hostname: their pids mean nothing here. A lock
    with no lease (an older keras-vit's) cannot be judged: refused, naming the way out."""
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


# --- the lease (issue #53): a run killed in one container resumes in the next --------------------------------

LEASE = 2.0  # seconds: the namespaced processes' lease (renewed every LEASE / RENEWALS)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# keras_vit.utils.locks in a fresh process without keras_vit/__init__ (Keras, TensorFlow): a tenth of a second.
_LOCKS_ONLY = ("import json, os, sys, time, types; pkg = types.ModuleType('keras_vit'); "
               f"pkg.__path__ = [{os.path.join(ROOT, 'keras_vit')!r}]; sys.modules['keras_vit'] = pkg; "
               "from keras_vit.utils import locks; ")
HOLD = _LOCKS_ONLY + "locks.acquire(sys.argv[1]); print('HELD', flush=True); time.sleep(600)"
TAKE = _LOCKS_ONLY + """
try:
    owner = locks.acquire(sys.argv[1])
except locks.WorkdirBusy as error:
    print('BUSY', error, flush=True); sys.exit(3)
locks.release(sys.argv[1], owner); print(json.dumps(owner), flush=True)"""


def _unshare_works():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return done.returncode == 0


needs_unshare = pytest.mark.skipif(not _unshare_works(),
                                   reason="no `unshare --pid --fork --mount-proc` here (needs root and Linux)")


def _in_new_pid_namespace(script, workdir, lease=LEASE, **popen):
    """`script` (argv[1]: the workdir) as pid 1 of a new pid namespace, as a restarted container's run."""
    env = {**os.environ, locks.LEASE_ENV: str(lease)}
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script, str(workdir)]
    return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _line(process, timeout=10):
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"no line from {process.args} within {timeout}s"
    return process.stdout.readline().strip()


@needs_unshare
def test_a_run_killed_in_one_pid_namespace_is_taken_over_from_a_new_one_once_its_lease_lapses(tmp_path):
    """OOM kill, preemption, pod restart: the resumed run starts in a new pid namespace, where the
    dead run's pid means nothing. While the holder lives its lease keeps being renewed and every
    other run is refused; killed, its lease lapses and a run of yet another namespace takes over."""
    workdir, lock = tmp_path / "run", tmp_path / "run" / locks.LOCK_FILE
    holder = _in_new_pid_namespace(HOLD, workdir, start_new_session=True)
    try:
        assert _line(holder) == "HELD", holder.stderr.read()
        owner, renewed = locks.read(str(workdir)), os.stat(lock).st_mtime_ns
        assert owner["pid"] == 1 and owner["pid_ns"] != locks._pid_namespace() and owner["lease_s"] == LEASE
        time.sleep(LEASE * 1.25)
        assert os.stat(lock).st_mtime_ns > renewed  # renewed: alive past one lease
        started = time.monotonic()
        refused = _in_new_pid_namespace(TAKE, workdir)
        out, err = refused.communicate(timeout=30)
        assert refused.returncode == 3 and "in another container" in out and "renews its lock" in out, out + err
        assert err == ""  # a live run is refused without a line about waiting
        assert time.monotonic() - started < LEASE  # at its next renewal, not after a lease
        with pytest.raises(locks.WorkdirBusy, match="pid 1 in another container"):  # nor from this namespace
            locks.acquire(str(workdir))
        assert locks.read(str(workdir)) == owner
        # Held open, the dead namespace keeps its number: a new one given it would ask the pid (see below).
        namespace = os.open(f"/proc/{holder.pid}/ns/pid_for_children", os.O_RDONLY)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # kill -9, the namespace's pid 1 with it
        holder.communicate()
    assert locks.read(str(workdir)) == owner  # left behind, as after an OOM kill
    started = time.monotonic()
    taker = _in_new_pid_namespace(TAKE, workdir)
    try:
        out, err = taker.communicate(timeout=30)
    finally:
        os.close(namespace)
    took = time.monotonic() - started
    assert taker.returncode == 0, out + err
    resumed = json.loads(out)
    assert resumed["pid_ns"] not in (owner["pid_ns"], locks._pid_namespace()) and resumed["token"] != owner["token"]
    lines = err.splitlines()
    assert len(lines) == 1 and "waiting" in lines[0] and f"{LEASE:g}s lease" in lines[0], err  # one line, time left
    assert "s more for its" in lines[0] and "in another container" in lines[0], err
    assert took < LEASE + 3  # one lease, no more (and the process start-up)
    assert os.listdir(workdir) == []  # released: no lock, no probe, nothing aside


def test_a_run_killed_in_this_pid_namespace_is_taken_over_at_once_whatever_its_lease(tmp_path, monkeypatch):
    """kill -9 and resume on one machine: the owner is asked (its pid is gone), no lease waited for."""
    workdir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], text=True, stdout=subprocess.PIPE,
                              env={**os.environ, locks.LEASE_ENV: "600"})
    try:
        assert _line(holder) == "HELD"
    finally:
        holder.kill()
        holder.communicate()
    assert locks.read(str(workdir))["lease_s"] == 600
    started = time.monotonic()
    with locks.held(str(workdir)):
        assert locks.read(str(workdir))["pid"] == os.getpid()
    assert time.monotonic() - started < 2


def _other_namespace(workdir, lease, renewed_s_ago):
    """A lock of a process of another pid namespace, last renewed `renewed_s_ago` seconds ago."""
    owner = {**locks.this_process(), "pid": 1, "pid_ns": (locks._pid_namespace() or 0) + 1, "lease_s": lease,
             "token": "their-token"}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / locks.LOCK_FILE).write_text(json.dumps(owner))
    then = time.time() - renewed_s_ago
    os.utime(workdir / locks.LOCK_FILE, (then, then))
    return owner


def test_a_lapsed_lease_of_another_namespace_is_taken_over_without_waiting(tmp_path, capsys):
    workdir = tmp_path / "run"
    _other_namespace(workdir, lease=5, renewed_s_ago=60)
    with locks.held(str(workdir)):
        assert locks.read(str(workdir))["pid"] == os.getpid()
    assert capsys.readouterr().err == ""


def test_a_lease_is_judged_by_the_storages_clock_not_this_hosts(tmp_path, monkeypatch):
    """NFS stamps mtimes with the server's clock: with this host's an hour ahead of it, a lock
    renewed a moment ago looks an hour old against time.time(). Against a file just created
    there it is a moment old."""
    workdir = tmp_path / "run"
    storage_behind = 3600e9
    current = _other_namespace(workdir, lease=5, renewed_s_ago=3600)  # stamped by the storage's clock: now
    mtime_ns = os.stat(workdir / locks.LOCK_FILE).st_mtime_ns
    created = locks._created_mtime_ns
    monkeypatch.setattr(locks, "_created_mtime_ns", lambda probe: created(probe) - storage_behind)
    clock = locks._StorageClock(str(workdir), "mine")
    assert locks._verdict(current, mtime_ns, clock) == "leased"
    assert locks._verdict(current, mtime_ns - int(10e9), clock) == "stale"  # not renewed for 10 s of the storage's
    assert os.listdir(workdir) == [locks.LOCK_FILE]  # the clock's probe is gone


def _fresh_lock_of_a_third_run(workdir):
    third = {"host": socket.gethostname(), "pid": os.getppid(), "started": "2024-01-01T00:00:01", "token": "third"}
    tmp = workdir / "third.tmp"
    tmp.write_text(json.dumps(third))
    os.link(tmp, workdir / locks.LOCK_FILE)  # as _create does: fails if a lock is there
    os.remove(tmp)
    return third


def _third_run_during(monkeypatch, name, third_run):
    """os.`name` as the take-over calls it on the lock moved aside (".stale-"), the first time
    running `third_run(args)` before it; -> the third run's lock, once it took it."""
    original, third = getattr(os, name), {}

    def with_a_third_run(*args):
        if any(".stale-" in str(arg) for arg in args) and not third:
            third.update(third_run(args))
        original(*args)

    monkeypatch.setattr(os, name, with_a_third_run)
    return third


def _its_own_take_over(args):
    os.remove(args[0])  # the stale lock, removed by the third run's own take-over, whole
    return _fresh_lock_of_a_third_run(pathlib.Path(args[0]).parent)


@pytest.mark.parametrize("name, third_run", [
    # Between judging the lock stale and moving it aside, a third run took it over: what is
    # moved is that run's fresh lock, which goes back.
    ("rename", _its_own_take_over),
    # The stale lock moved aside and checked, a run that found the place empty created its lock:
    # ours is created with the exclusive link, which fails.
    ("remove", lambda args: _fresh_lock_of_a_third_run(pathlib.Path(args[0]).parent)),
])
def test_a_take_over_never_replaces_a_third_run_s_lock(tmp_path, monkeypatch, name, third_run):
    workdir = tmp_path / "run"
    _lock(workdir, _dead_pid())
    third = _third_run_during(monkeypatch, name, third_run)
    with pytest.raises(locks.WorkdirBusy, match=f"pid {os.getppid()}"):  # this run is refused
        locks.acquire(str(workdir))
    assert third and locks.read(str(workdir)) == third
    assert os.listdir(workdir) == [locks.LOCK_FILE]


def test_a_lease_renewed_after_it_was_judged_lapsed_is_put_back(tmp_path, monkeypatch):
    """A late renewal (its owner was slow, not dead) between judging and moving aside: the file
    moved is the same owner's but renewed, so it goes back, renewed, and this run is refused."""
    workdir = tmp_path / "run"
    owner = _other_namespace(workdir, lease=3, renewed_s_ago=30)
    rename = os.rename

    def renewed_first(src, dst):
        if ".stale-" in str(dst):
            os.utime(src)  # the owner's renewal
        rename(src, dst)

    monkeypatch.setattr(os, "rename", renewed_first)
    with pytest.raises(locks.WorkdirBusy, match="in another container"):
        locks.acquire(str(workdir))
    assert locks.read(str(workdir)) == owner and locks.storage.age_s(str(workdir / locks.LOCK_FILE)) < 5
    assert os.listdir(workdir) == [locks.LOCK_FILE]


def _renewers():
    return [t for t in threading.enumerate() if t.name.startswith("keras-vit lock lease")]


def test_the_lease_is_renewed_while_held_by_a_daemon_that_stops_with_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(locks.LEASE_ENV, "0.45")  # renewed every 0.05 s
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    workdir = tmp_path / "run"
    with locks.held(str(workdir)):
        lock = workdir / locks.LOCK_FILE
        assert locks.read(str(workdir))["lease_s"] == 0.45
        os.utime(lock, (1, 1))
        deadline = time.monotonic() + 5
        while os.stat(lock).st_mtime < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert locks.storage.age_s(str(lock)) < 1  # renewed
        (renewer,) = _renewers()
        assert renewer.daemon  # never keeps the process alive
    assert not renewer.is_alive() and not _renewers() and not workdir.exists()
    assert {number: signal.getsignal(number) for number in handlers} == handlers


def _failing_renewals(monkeypatch, count):
    """Makes the next `count` renewals (os.utime) fail as a storage error, then heals it; how many failed."""
    failures, utime = [], os.utime

    def failing(path, *args, **kwargs):
        failures.append(path)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "utime", failing)
    deadline = time.monotonic() + 5
    while len(failures) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    monkeypatch.setattr(os, "utime", utime)
    return len(failures)


def test_a_storage_error_while_renewing_is_warned_of_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(locks.LEASE_ENV, "0.45")
    workdir = tmp_path / "run"
    with locks.held(str(workdir)):
        assert _failing_renewals(monkeypatch, 3) >= 3 and _renewers()  # still renewing
    err = capsys.readouterr().err
    assert err.count("keras-vit: warning: cannot renew the lock") == 1 and "Input/output error" in err, err
    assert len(err.splitlines()) == 1 and not workdir.exists()


def test_a_holder_whose_lock_was_taken_over_warns_once_and_stops_renewing(tmp_path, monkeypatch, capsys):
    """Stopped (Ctrl-Z, a suspended machine) past its lease, a run of another container took over."""
    monkeypatch.setenv(locks.LEASE_ENV, "0.45")
    workdir = tmp_path / "run"
    owner = locks.acquire(str(workdir))
    renewer = locks._renewers[owner["token"]]
    other = _other_namespace(workdir, lease=90, renewed_s_ago=0)
    renewer.join(timeout=5)
    assert not renewer.is_alive()
    err = capsys.readouterr().err
    assert err.count("was taken over by pid 1 in another container") == 1, err
    locks.release(str(workdir), owner)
    assert locks.read(str(workdir)) == other  # the other run's, left alone


def test_a_take_over_is_warned_of_after_a_storage_error_was(tmp_path, monkeypatch, capsys):
    """Storage errors longer than the lease are the likely way to lose a lock: the take-over that
    follows them is said too, each warning once."""
    monkeypatch.setenv(locks.LEASE_ENV, "0.45")
    workdir = tmp_path / "run"
    owner = locks.acquire(str(workdir))
    renewer = locks._renewers[owner["token"]]
    assert _failing_renewals(monkeypatch, 2) >= 2
    _other_namespace(workdir, lease=90, renewed_s_ago=0)
    renewer.join(timeout=5)
    err = capsys.readouterr().err
    assert err.count("cannot renew the lock") == 1 and err.count("was taken over by pid 1") == 1, err
    locks.release(str(workdir), owner)


@needs_proc
def test_a_leased_lock_of_another_boot_is_judged_by_its_lease(tmp_path):
    """Another boot id under this host's name and pid namespace may be another machine of the same
    name on shared storage (localhost, cloned VMs), its run alive: its lease decides; a lock
    without a lease (an older keras-vit's) is of a boot whose processes are gone."""
    if not locks._boot_id():
        pytest.skip("no boot id in /proc here")
    other = {**locks.this_process(), "boot_id": "another-boot", "lease_s": 90}
    assert not locks.is_stale(other, renewed_s_ago=1)
    assert locks.is_stale(other, renewed_s_ago=91)
    assert not locks.is_stale(other)  # its age unknown
    assert locks.is_stale({k: v for k, v in other.items() if k != "lease_s"})
    workdir = tmp_path / "run"  # a run's lock from before this host rebooted, its lease long lapsed
    workdir.mkdir()
    (workdir / locks.LOCK_FILE).write_text(json.dumps({**other, "lease_s": 5}))
    os.utime(workdir / locks.LOCK_FILE, (time.time() - 60, time.time() - 60))
    with locks.held(str(workdir)):
        assert locks.read(str(workdir))["pid"] == os.getpid()


def test_a_lease_that_is_not_a_finite_number_is_the_default(monkeypatch):
    for value in ("inf", "nan", "0", "-3", "soon"):
        monkeypatch.setenv(locks.LEASE_ENV, value)
        assert locks.lease_s() == locks.LEASE_S


@needs_unshare
@pytest.mark.slow
def test_keras_vit_train_killed_in_one_container_resumes_in_the_next(tmp_path):
    """The trainer's promise across a pod restart: `keras-vit train` killed with kill -9 in one
    pid namespace, the same command in a new one waits out the lease and resumes."""
    workdir = tmp_path / "run"
    keras_vit = [os.path.join(os.path.dirname(sys.executable), "keras-vit")]
    command = [*keras_vit, *TRAIN, "--steps", "60", "--checkpoint-every", "10", "--workdir", str(workdir)]
    env = {**os.environ, locks.LEASE_ENV: str(LEASE)}
    run = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    first = subprocess.Popen(run, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list((workdir / "checkpoints").glob("ckpt-*")) and first.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        out = first.communicate()[0]
    assert first.returncode == -signal.SIGKILL and locks.read(str(workdir))["pid"] == 1, out
    resumed = subprocess.run(run, env=env, text=True, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming at step" in resumed.stdout, resumed.stdout
    # TensorFlow's start-up may outlast the short lease: then no wait, else its one line.
    assert len([line for line in resumed.stderr.splitlines() if "lease" in line]) <= 1, resumed.stderr
    assert json.loads((workdir / "results.json").read_text())["steps"] == 60
    assert not (workdir / locks.LOCK_FILE).exists()


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


def test_object_storage_gets_the_lease_too(monkeypatch):
    """gs://-style storage (ram:// here, its objects stamped with their write time as an object store
    stamps them): a lapsed lease of another container is taken over, and a held lock is renewed by
    rewriting it."""
    import secrets

    from keras_vit.utils import storage

    stamps, write_bytes = {}, storage.write_bytes

    def stamped(path, data):
        write_bytes(path, data)
        stamps[os.fspath(path)] = time.time()

    monkeypatch.setattr(storage, "write_bytes", stamped)
    monkeypatch.setattr(storage, "getmtime", lambda path: stamps.get(os.fspath(path), 0.0))
    monkeypatch.setenv(locks.LEASE_ENV, "0.45")
    workdir = f"ram://locks-{secrets.token_hex(4)}/run"
    path = locks.lock_path(workdir)
    storage.makedirs(workdir)
    theirs = {**locks.this_process(), "pid": 1, "pid_ns": (locks._pid_namespace() or 0) + 1, "lease_s": 5,
              "token": "their-token"}
    storage.write_text(path, json.dumps(theirs))
    stamps[path] -= 60  # renewed a minute ago
    with locks.held(workdir):
        ours = locks.read(workdir)
        assert ours["pid"] == os.getpid() and ours["token"] != "their-token"
        taken, deadline = stamps[path], time.monotonic() + 5
        while stamps[path] == taken and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stamps[path] > taken and locks.read(workdir) == ours  # rewritten, unchanged
    assert locks.read(workdir) is None


def test_a_lock_put_back_without_hard_links_never_replaces_one_made_in_the_gap(tmp_path, monkeypatch):
    def no_links(*args):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    aside, path = tmp_path / "lock.aside", tmp_path / "lock"
    aside.write_text("judged")
    locks._put_back(str(aside), str(path))  # nothing in the way: moved back
    assert path.read_text() == "judged" and not aside.exists()
    path.write_text("a new run's")
    aside.write_text("judged")
    locks._put_back(str(aside), str(path))  # a lock made meanwhile keeps its place
    assert path.read_text() == "a new run's" and not aside.exists()
