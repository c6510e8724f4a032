"""One writer per workdir: a lock file taken before a run writes anything.

    with locks.held("runs/demo"):   # WorkdirBusy (a UserError) if another run holds it
        ...train...

TensorFlow's checkpoints, results.json and model.keras all assume one writer:
two runs on one workdir would each overwrite the other's files and both
report success. The lock is `<workdir>/.keras-vit.lock`, a small JSON file
naming its owner: host, pid, start time, command, a random token, its lease
in seconds and, where Linux's /proc has them, the boot id, the pid namespace
and the process's start time in clock ticks (what tells a live owner from a
pid reused since).

- Locally it is written whole under a temporary name and hard-linked into
  place: the link fails if a lock exists, so only one process wins, and no
  reader ever sees it half written (a filesystem without hard links falls
  back to O_CREAT|O_EXCL, then writing; a lock that cannot be parsed and is
  younger than FRESH_S counts as being written). It is deleted when the run
  ends, however it ends (a finished run, an exception, Ctrl-C, SIGTERM).
- A lock of this host and pid namespace is judged exactly (is_stale): its
  owner is gone with no such pid, or when the pid now
  belongs to a process started at another time (reused after a reboot or a
  restart, or this very process). So a run killed with kill -9 is taken over
  at once by the next one. A lock of another boot id under this host's name
  is judged by its lease, as another host's: it may be another machine of the
  same name sharing the storage (localhost, cloned VMs; the initial pid
  namespace looks alike on every host); an older lock without a lease is of a
  boot whose processes are gone.
- The lease: while it holds the lock, a daemon thread renews it every
  lease/RENEWALS seconds (10 s of LEASE_S = 90 s; KERAS_VIT_LOCK_LEASE_S sets
  another lease): it touches the file, which moves its mtime. An owner that
  cannot be asked from here (another pid namespace, as after an OOM kill, a
  preemption or a pod restart; another host) is alive while its lease runs:
  the lock was renewed less than its lease_s ago. Ago is measured by the
  storage's clock, never this host's: the lock's mtime against the mtime of
  a file this process has just created beside it (both stamped by the
  storage; the time since then counted on a monotonic clock), so hosts with
  skewed clocks agree. A lock whose lease runs is watched:
  renewed, its owner is live and the run is refused (within one renewal, 10 s);
  not renewed for 1.5 renewals, its owner is taken to be gone and the run
  says so on one line and waits the rest of the lease, then takes over. A
  lock of another namespace without a lease (an older keras-vit) is refused,
  naming the way out: delete it once that run is known to be gone.
- Take-over, never over another's lock: the stale lock judged (its content
  and mtime) is renamed aside to a name of our own token (of two takers, one
  rename succeeds; the other finds no file and goes straight to creating).
  The file moved is read: if it is not the one judged (another content: a
  third run's fresh lock, taken meanwhile; another mtime: renewed since, its
  owner alive), it is linked back into place (a link, so that never over a
  lock created in the gap either) and the run is refused. If it is the one
  judged, it is deleted and ours created with the exclusive link: a run that
  took the empty place in between keeps it, and ours is refused.
- The renewal stops when the lock is released, never keeps the process
  alive, sets no signal handler, and a storage error does not stop the run:
  it is warned of once, and renewing goes on. If the lock was taken over (its
  owner stopped, Ctrl-Z or a suspended machine, for longer than its lease),
  the thread warns once and stops renewing.
- On gs://-style storage (anything keras_vit.utils.storage reaches through
  tf.io.gfile) there is no exclusive create and no rename that fails: the
  lock is written whole (an object appears whole) after checking that none
  exists, then read back to check it is ours, so two runs started within the
  same instant could still both pass. The lease is renewed by rewriting the
  object and judged by the storage's modification times, as locally; a
  take-over checks again that the lock is the one judged before deleting
  it, but without a conditional write two takers of one stale lock, or a
  renewal stalled past its lease, can still overwrite each other there. Storage that records no modification time (ram://) judges no lease:
  an owner that cannot be asked from here is refused.
- A multi-worker run is one writer: only the chief (the task that writes
  checkpoints and results) takes the lock; the other workers only read.

This module imports neither Keras nor TensorFlow (a local workdir).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
from typing import Iterator, Optional, Tuple

from keras_vit.utils import console as _console, storage
from keras_vit.errors import UserError

LOCK_FILE = ".keras-vit.lock"
FRESH_S = 10  # an unparsable lock younger than this is being written (O_EXCL fallback), not stale
LEASE_S = 90.0  # an owner that cannot be asked from here is alive while it renewed its lock within this
LEASE_ENV = "KERAS_VIT_LOCK_LEASE_S"  # another lease, in seconds (tests: a short one)
RENEWALS = 9  # per lease: a live owner renews every LEASE_S / RENEWALS (10 s), so one late renewal is no death
_ATTEMPTS = 4  # create-judge rounds before giving up on a lock that keeps changing hands
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

# Tokens of the locks this process holds: a lock naming our pid with another token is a predecessor's.
_held_tokens = set()
_renewers = {}  # token -> the _Renewer thread of a lock this process holds


class WorkdirBusy(UserError):
    """Another live run holds the workdir's lock."""


def lock_path(workdir: str) -> str:
    return storage.join(workdir, LOCK_FILE)


@contextlib.contextmanager
def held(workdir: str, writer: bool = True) -> Iterator[None]:
    """Holds `workdir`'s lock for the `with` block (nothing when not `writer`:
    a non-chief worker). A workdir the block created and left empty is removed,
    so a refused run leaves nothing behind."""
    if not writer:
        yield
        return
    created = not storage.exists(workdir)
    owner = acquire(workdir)
    try:
        yield
    finally:
        release(workdir, owner)
        if created:
            with contextlib.suppress(OSError):
                if not storage.listdir(workdir):
                    _remove_empty_folder(workdir)


def acquire(workdir: str) -> dict:
    """Takes the lock (a stale one taken over, after waiting for the lease of
    an owner of another container or host to lapse) and starts renewing it;
    returns what it holds. Raises WorkdirBusy naming the live owner, UserError
    when `workdir` cannot be written."""
    owner = {**this_process(held=True), "lease_s": lease_s()}  # known as ours before the file exists
    made = storage.topmost_missing(workdir)
    try:
        storage.makedirs(workdir)
        _take(workdir, owner)
    except BaseException as error:
        _held_tokens.discard(owner["token"])
        if not isinstance(error, OSError):
            raise
        _remove_made(made, workdir)  # a refused run leaves no folders behind
        raise UserError(f"{_console.argument('workdir', workdir)} cannot be written ({error.strerror or error}): "
                        f"give a folder this user can write.") from None
    renewer = _renewers[owner["token"]] = _Renewer(workdir, owner)
    renewer.start()
    return owner


def release(workdir: str, owner: dict) -> None:
    """Stops renewing the lock, then deletes it if it is still `owner`'s (one
    taken over meanwhile is left alone)."""
    _held_tokens.discard(owner.get("token"))
    renewer = _renewers.pop(owner.get("token"), None)
    if renewer is not None:
        renewer.stop()
    with contextlib.suppress(OSError):
        if read(workdir) == owner:
            storage.remove(lock_path(workdir))


def read(workdir: str) -> Optional[dict]:
    """The lock's owner, None when there is no lock; {} when it cannot be parsed
    (being written, or damaged: see _verdict)."""
    try:
        return json.loads(storage.read_text(lock_path(workdir)))
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return {}


def is_stale(owner: dict, renewed_s_ago: Optional[float] = None) -> bool:
    """Whether the owner is known to be gone. One of this host and pid namespace
    is asked (a field the lock lacks, as in an older lock or without /proc, is
    not compared: host and pid decide then); any other is gone once its lease
    lapsed: `renewed_s_ago` (by the storage's clock) past its lease_s. Without
    either it cannot be told, and is not stale."""
    if not owner.get("pid") or not owner.get("host"):
        return True  # unreadable: see _verdict for one being written
    if not _asked(owner):
        lease = _lease_of(owner)
        return lease is not None and renewed_s_ago is not None and renewed_s_ago > lease
    if _other_boot(owner):
        return True  # an older lock without a lease, rebooted since: every process of then is gone
    pid = int(owner["pid"])
    if pid == os.getpid():
        return owner.get("token") not in _held_tokens  # our pid, not our lock: a predecessor's
    if not _alive(pid):
        return True
    recorded, now = owner.get("proc_start"), _process_start(pid)
    return recorded is not None and now is not None and recorded != now  # the pid was reused


def lease_s() -> float:
    """The lease this process's locks get: KERAS_VIT_LOCK_LEASE_S when set to a positive number, else LEASE_S."""
    with contextlib.suppress(ValueError):
        value = float(os.environ.get(LEASE_ENV, ""))
        if 0 < value < float("inf"):
            return value
    return float(LEASE_S)


def writer_role(strategy: str = "auto", environ=None) -> bool:
    """Whether this process is the one writer of its run: True unless it is a
    non-chief task of a multi-worker cluster (TF_CONFIG), the same rule as
    keras_vit.training.strategies.is_chief, read without TensorFlow."""
    environ = os.environ if environ is None else environ
    if strategy not in ("auto", "multi_worker"):
        return True
    try:
        tf_config = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return True  # make_strategy names the bad TF_CONFIG
    cluster, task = tf_config.get("cluster") or {}, tf_config.get("task") or {}
    if sum(len(v) for v in cluster.values()) <= 1 or not task.get("type"):
        return True
    if task["type"] == "chief":
        return True
    return task["type"] == "worker" and int(task.get("index", 0)) == 0 and "chief" not in cluster


# --- how: who ----------------------------------------------------------------------------------------

def this_process(held: bool = False) -> dict:
    """This process as a lock's owner; boot_id, pid_ns and proc_start only where /proc has them.
    `held`: is_stale knows it as this process's own (another owner naming our pid is a predecessor's)."""
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200],
             "token": secrets.token_hex(8), "boot_id": _boot_id(), "pid_ns": _pid_namespace(),
             "proc_start": _process_start(os.getpid())}
    if held:
        _held_tokens.add(owner["token"])
    return {k: v for k, v in owner.items() if v is not None}


def _boot_id() -> Optional[str]:
    with contextlib.suppress(OSError):
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    return None


def _pid_namespace() -> Optional[int]:
    with contextlib.suppress(OSError, AttributeError):
        return os.stat("/proc/self/ns/pid").st_ino
    return None


def _process_start(pid: int) -> Optional[int]:
    """Field 22 of /proc/PID/stat (starttime, clock ticks after boot), None without /proc.
    Read after the last ')': the command name before it may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[22 - 3])  # the fields after ')' start at field 3 (state)
    except (OSError, IndexError, ValueError):
        return None


def _same_pid_namespace(owner: dict) -> bool:
    """Whether the owner's pid means the same process here (a lock without the field: assumed)."""
    return owner.get("pid_ns") is None or owner["pid_ns"] == _pid_namespace()


def _askable(owner: dict) -> bool:
    """Whether the owner's process can be asked from here: this host's name, this pid namespace."""
    return owner.get("host") == socket.gethostname() and _same_pid_namespace(owner)


def _other_boot(owner: dict) -> bool:
    boot_id = _boot_id()
    return bool(owner.get("boot_id") and boot_id and owner["boot_id"] != boot_id)


def _asked(owner: dict) -> bool:
    """Whether is_stale asks the owner's process (askable, this boot), else judges its lease.
    Another boot id under this host's name and pid namespace is this host rebooted, or another
    machine of the same name (localhost, cloned VMs: the initial pid namespace is alike on every
    host) sharing the storage, whose run may be alive: a lock with a lease is judged by it."""
    return _askable(owner) and not (_other_boot(owner) and _lease_of(owner) is not None)


def _lease_of(owner: dict) -> Optional[float]:
    with contextlib.suppress(TypeError, ValueError):
        return float(owner["lease_s"]) if owner.get("lease_s") else None
    return None


# --- how: taking ----------------------------------------------------------------------------------------

def _take(workdir: str, owner: dict) -> None:
    """Creates the lock, or takes over a stale one; WorkdirBusy when its owner is alive."""
    path, clock, waited = lock_path(workdir), _StorageClock(workdir, owner["token"]), False
    for _ in range(_ATTEMPTS):
        if _create(path, owner):
            return
        current, mtime_ns = _read_stamped(path)
        if current is None:
            continue  # released meanwhile: create again
        verdict = _verdict(current, mtime_ns, clock)
        if verdict == "leased" and not waited:
            waited = True  # once: a lock that changes hands while we wait is a live run's
            if _lease_lapsed(workdir, current, mtime_ns, clock):
                continue  # judged again (now stale, or gone, or another's)
            verdict = "live"
        if verdict != "stale":
            raise WorkdirBusy(_busy_message(workdir, current))
        if _take_over(workdir, current, mtime_ns, owner):
            return
    raise WorkdirBusy(_busy_message(workdir, read(workdir) or {}))


def _verdict(current: dict, mtime_ns: int, clock: "_StorageClock") -> str:
    """"stale" (take it over), "live" (refuse) or "leased" (an owner that cannot be asked, its lease running)."""
    if not current:  # unparsable: being written while young (O_EXCL fallback), damaged when old
        age = clock.age_s(mtime_ns)
        return "live" if age is not None and age < FRESH_S else "stale"
    if _asked(current) or not current.get("pid") or _lease_of(current) is None:
        return "stale" if is_stale(current) else "live"
    age = clock.age_s(mtime_ns)
    return "stale" if is_stale(current, age) else ("leased" if age is not None else "live")


def _lease_lapsed(workdir: str, current: dict, mtime_ns: int, clock: "_StorageClock") -> bool:
    """Watches a running lease: False as soon as its owner renews it (alive), True when
    it lapsed or the lock changed otherwise (gone, replaced: to be judged again). Says
    so on one line once the lock went unrenewed for 1.5 renewals (a live owner would have)."""
    lease = _lease_of(current)
    renewal = lease / RENEWALS
    poll, announced = min(1.0, renewal / 4), False
    while True:
        age = clock.age_s(mtime_ns)
        if age > lease:
            return True
        if not announced and age > 1.5 * renewal:
            announced = True
            _console.warn(f"{_console.argument('workdir', workdir)} is locked by pid {current.get('pid', '?')} "
                          f"{_where(current)}, not renewed for {_s(age)}: waiting {_s(lease - age)} more for its "
                          f"{_s(lease)} lease to lapse, then taking the workdir over (a live run renews it every "
                          f"{_s(renewal)}).")
        time.sleep(min(poll, lease - age + 0.05))
        now, now_mtime_ns = _read_stamped(lock_path(workdir))
        if now != current:
            return True
        if now_mtime_ns != mtime_ns:
            return False


def _take_over(workdir: str, stale: dict, mtime_ns: int, owner: dict) -> bool:
    """Replaces the stale lock judged (its content, its mtime) by ours; False when
    another run created one first (to be judged again), WorkdirBusy when the lock
    in place turns out not to be the one judged. Never over another's lock: see
    the module docstring."""
    path = lock_path(workdir)
    if storage.is_remote(path):
        if _read_stamped(path) != (stale, mtime_ns):
            return False  # changed since judged: judged again
        with contextlib.suppress(FileNotFoundError):
            storage.remove(path)
        return _create(path, owner)
    aside = f"{path}.stale-{owner['token']}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return _create(path, owner)  # another taker moved it: the exclusive link decides
    moved, moved_mtime_ns = _read_stamped(aside)
    if (moved, moved_mtime_ns) != (stale, mtime_ns):
        _put_back(aside, path)  # a third run's fresh lock, or one renewed since: its owner is alive
        raise WorkdirBusy(_busy_message(workdir, moved or {}))
    os.remove(aside)
    return _create(path, owner)


def _put_back(aside: str, path: str) -> None:
    """Moves a lock taken aside by mistake back, by a link: never over a lock created in the gap
    (that one's run keeps the workdir; the owner of the one aside warns that it lost it)."""
    try:
        os.link(aside, path)
    except FileExistsError:
        pass
    except OSError:  # no hard links here: a rename, unless a lock is there
        if not os.path.exists(path):
            os.rename(aside, path)
            return
    os.remove(aside)


def _read_stamped(path: str) -> Tuple[Optional[dict], int]:
    """The lock at `path` (None: none, {}: unparsable) and its mtime in ns as the storage recorded it
    (0 where the storage records none); locally both of the one file opened."""
    try:
        if storage.is_remote(path):
            text, mtime_ns = storage.read_text(path), int(storage.getmtime(path) * 1e9)
        else:
            with open(path, encoding="utf-8") as f:
                mtime_ns, text = os.fstat(f.fileno()).st_mtime_ns, f.read()
    except FileNotFoundError:
        return None, 0
    except (OSError, ValueError):
        return {}, 0
    try:
        return json.loads(text), mtime_ns
    except ValueError:
        return {}, mtime_ns


class _StorageClock:
    """Now as the storage tells it: the mtime of a file created beside the lock (once,
    when first asked), then counted on by this host's monotonic clock."""

    def __init__(self, workdir: str, token: str):
        self.probe = f"{lock_path(workdir)}.{token}.now"
        self.origin: Optional[Tuple[int, int]] = None

    def age_s(self, mtime_ns: int) -> Optional[float]:
        """Seconds since `mtime_ns` by the storage's clock; None where it records no times."""
        if self.origin is None:
            self.origin = (_created_mtime_ns(self.probe), time.monotonic_ns())
        storage_ns, monotonic_ns = self.origin
        if not storage_ns or not mtime_ns:
            return None
        return max(0.0, (storage_ns + time.monotonic_ns() - monotonic_ns - mtime_ns) / 1e9)


def _created_mtime_ns(probe: str) -> int:
    """The mtime the storage gives a file created now (it is deleted again)."""
    if storage.is_remote(probe):
        storage.write_text(probe, "now")  # not empty: ram:// makes no empty file
        try:
            return int(storage.getmtime(probe) * 1e9)
        finally:
            with contextlib.suppress(OSError):
                storage.remove(probe)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
        os.remove(probe)


def _create(path: str, owner: dict) -> bool:
    """Creates the lock file holding `owner`, whole; False if one exists already."""
    text = json.dumps(owner)
    if storage.is_remote(path):
        if storage.exists(path):
            return False
        storage.write_text(path, text)
        return json.loads(storage.read_text(path)) == owner  # another writer's came last: not ours
    tmp = f"{path}.{owner['token']}.tmp"
    try:
        _write_synced(tmp, text, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        return _link(tmp, path, text)
    finally:  # also after a failed write (a full disk): the workdir is left as it was
        with contextlib.suppress(OSError):
            os.remove(tmp)


def _link(tmp: str, path: str, text: str) -> bool:
    try:
        os.link(tmp, path)  # atomic: appears with its content, fails if a lock exists
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some network and FUSE filesystems)
        return _create_exclusive(path, text)


def _create_exclusive(path: str, text: str) -> bool:
    """O_EXCL, then the content: a reader in between sees an empty file (see _verdict)."""
    try:
        _write_synced(path, text, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    return True


def _write_synced(path: str, text: str, flags: int) -> None:
    fd = os.open(path, flags, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


# --- how: renewing ----------------------------------------------------------------------------------------

class _Renewer(threading.Thread):
    """Renews a held lock every lease/RENEWALS seconds until stop(). A daemon:
    it never keeps the process alive. A storage error is warned of once and
    renewing goes on; a lock taken over by another run is warned of and left."""

    def __init__(self, workdir: str, owner: dict):
        super().__init__(name=f"keras-vit lock lease ({workdir})", daemon=True)
        self.workdir, self.owner = workdir, owner
        self.every = _lease_of(owner) / RENEWALS
        self.stopped = threading.Event()
        self.warned = set()  # each kind of warning once: a storage error must not silence a take-over

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                if not self.renew():
                    return
            except Exception as error:  # noqa: BLE001 - the run goes on; the next renewal may work
                why = getattr(error, "strerror", None) or error
                self.warn("error", f"cannot renew the lock of {self.workdir} ({why}); "
                          f"trying again every {_s(self.every)}: after {_s(_lease_of(self.owner))} of this a run "
                          f"of another container or host may take the workdir over.")

    def renew(self) -> bool:
        """Touches the lock while it is ours; False (stop) once another run holds it."""
        path = lock_path(self.workdir)
        current = json.loads(storage.read_text(path))  # gone, unreadable, damaged: warned of, tried again
        if current.get("token") != self.owner["token"]:
            self.warn("taken", f"the lock of {self.workdir} was taken over by pid {current.get('pid', '?')} "
                      f"{_where(current)} (this run was not heard from for its {_s(_lease_of(self.owner))} lease): "
                      f"two runs now write there; stop one.")
            return False
        if self.stopped.is_set():  # released meanwhile: a rewrite would bring the lock back
            return False
        if storage.is_remote(path):
            storage.write_text(path, json.dumps(current))  # an object's mtime moves only when it is rewritten
        else:
            os.utime(path)  # now, by the storage's clock (NFS: the server's)
        return True

    def warn(self, kind: str, message: str) -> None:
        if kind not in self.warned and not self.stopped.is_set():
            self.warned.add(kind)
            _console.warn(message)

    def stop(self) -> None:
        self.stopped.set()
        if self is not threading.current_thread():
            self.join(timeout=self.every)  # a renewal hung on the storage is not waited for


# --- messages and leftovers --------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    except OSError as error:
        return error.errno != errno.ESRCH
    return True


def _where(owner: dict) -> str:
    host = owner.get("host", "?")
    return f"in another container on {host}" if host == socket.gethostname() and not _askable(owner) else f"on {host}"


def _s(seconds: float) -> str:
    """Seconds for a message: 90s, 9.5s, 0.22s."""
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.2g}s"


def _busy_message(workdir: str, owner: dict) -> str:
    who = f"pid {owner.get('pid', '?')} {_where(owner)}, since {owner.get('started', '?')}"
    way_out = f"if that run is gone, delete its {LOCK_FILE}"
    if not owner:
        who = "its lock is being written this instant"
    elif not _askable(owner) and _lease_of(owner) is not None:
        way_out = f"it renews its lock every {_s(_lease_of(owner) / RENEWALS)} while it runs"
    return (f"{_console.argument('workdir', workdir)} is in use by another training ({who}): wait for it to end "
            f"or give another {_console.either('--workdir', 'workdir')} ({way_out}).")


def _remove_made(made: Optional[str], workdir: str) -> None:
    """Removes the folders from `workdir` up to `made` that acquire created, while they are empty."""
    if made is None:
        return
    folder = os.path.abspath(workdir)
    with contextlib.suppress(OSError):
        while True:
            os.rmdir(folder)  # OSError when not empty (or gone): stop there
            if folder == made:
                return
            folder = os.path.dirname(folder)


def _remove_empty_folder(path: str) -> None:
    if storage.is_remote(path):
        return  # an object store has no empty folders to leave behind
    os.rmdir(path)
