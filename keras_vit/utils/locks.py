"""One writer per workdir: a lock file taken before a run writes anything.

    with locks.held("runs/demo"):   # WorkdirBusy (a UserError) if another run holds it
        ...train...

TensorFlow's checkpoints, results.json and model.keras all assume one writer:
two runs on one workdir would each overwrite the other's files and both
report success. The lock is `<workdir>/.keras-vit.lock`, a small JSON file
naming its owner: host, pid, start time, command, a random token and, where
Linux's /proc has them, the boot id, the pid namespace and the process's
start time in clock ticks (what tells a live owner from a pid reused since).

- Locally it is written whole under a temporary name and hard-linked into
  place: the link fails if a lock exists, so only one process wins, and no
  reader ever sees it half written (a filesystem without hard links falls
  back to O_CREAT|O_EXCL, then writing; a lock that cannot be parsed and is
  younger than FRESH_S counts as being written). It is deleted when the run
  ends, however it ends (a finished run, an exception, Ctrl-C, SIGTERM).
  After kill -9 or a crash the file stays; the next run takes it over when
  its owner is known to be gone (see is_stale): another boot, no such pid,
  or a pid that now belongs to a process started at another time (reused
  after a reboot or a restart, or this very process).
- A lock of this hostname written in another pid namespace (a container
  sharing the host's network, hence its hostname; a container before a
  restart that gave it a new namespace) cannot be checked from here: it is
  refused as another host's is.
- On gs://-style storage (anything keras_vit.utils.storage reaches through
  tf.io.gfile) there is no exclusive create: the lock is written whole (an
  object appears whole) after checking that none exists, then read back to
  check it is ours, so two runs started within the same instant could still
  both pass. A lock of this host is judged as locally; one written by
  another host cannot be checked from here, so it is refused with the way
  out: delete the lock file once that run is known to be gone.
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
import time
from typing import Iterator, Optional

from keras_vit.utils import console as _console, storage
from keras_vit.errors import UserError

LOCK_FILE = ".keras-vit.lock"
FRESH_S = 10  # an unparsable lock younger than this is being written (O_EXCL fallback), not stale
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

# Tokens of the locks this process holds: a lock naming our pid with another token is a predecessor's.
_held_tokens = set()


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
    """Takes the lock (a stale one taken over); returns what it holds. Raises
    WorkdirBusy naming the live owner, UserError when `workdir` cannot be written."""
    owner = this_process(held=True)  # known as ours before the file exists
    made = storage.topmost_missing(workdir)
    try:
        storage.makedirs(workdir)
        if not _create(lock_path(workdir), owner):
            current = read(workdir)
            if current is not None and not _stale_file(workdir, current):
                raise WorkdirBusy(_busy_message(workdir, current))
            _take_over(workdir, current, owner)
    except BaseException as error:
        _held_tokens.discard(owner["token"])
        if not isinstance(error, OSError):
            raise
        _remove_made(made, workdir)  # a refused run leaves no folders behind
        raise UserError(f"{_console.argument('workdir', workdir)} cannot be written ({error.strerror or error}): "
                        f"give a folder this user can write.") from None
    return owner


def release(workdir: str, owner: dict) -> None:
    """Deletes the lock if it is still `owner`'s (one taken over meanwhile is left alone)."""
    _held_tokens.discard(owner.get("token"))
    with contextlib.suppress(OSError):
        if read(workdir) == owner:
            storage.remove(lock_path(workdir))


def read(workdir: str) -> Optional[dict]:
    """The lock's owner, None when there is no lock; {} when it cannot be parsed
    (being written, or damaged: see _stale_file)."""
    try:
        return json.loads(storage.read_text(lock_path(workdir)))
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return {}


def is_stale(owner: dict) -> bool:
    """Whether the owner is known to be gone. A field the lock lacks (an older
    lock, a system without /proc) is not compared: host and pid decide then."""
    if not owner.get("pid") or not owner.get("host"):
        return True  # unreadable: see _stale_file for one being written
    if owner["host"] != socket.gethostname() or not _same_pid_namespace(owner):
        return False  # another machine's (or container's) process cannot be asked from here
    boot_id = _boot_id()
    if owner.get("boot_id") and boot_id and owner["boot_id"] != boot_id:
        return True  # rebooted since: every process of then is gone, whatever reuses its pid
    pid = int(owner["pid"])
    if pid == os.getpid():
        return owner.get("token") not in _held_tokens  # our pid, not our lock: a predecessor's
    if not _alive(pid):
        return True
    recorded, now = owner.get("proc_start"), _process_start(pid)
    return recorded is not None and now is not None and recorded != now  # the pid was reused


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


# --- how -----------------------------------------------------------------------------------------------

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


def _stale_file(workdir: str, owner: dict) -> bool:
    """is_stale, except that an unparsable lock younger than FRESH_S is one being written."""
    if not owner and storage.age_s(lock_path(workdir)) < FRESH_S:
        return False
    return is_stale(owner)



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
    """O_EXCL, then the content: a reader in between sees an empty file (see _stale_file)."""
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


def _take_over(workdir: str, stale: Optional[dict], owner: dict) -> None:
    """Replaces a stale lock. Of two runs taking over at once one wins: the
    stale file is moved aside (one rename succeeds), then created anew."""
    path = lock_path(workdir)
    if not storage.is_remote(path):
        aside = f"{path}.stale-{secrets.token_hex(4)}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, aside)
            moved = _read_local(aside)
            if moved != (stale or {}) and moved is not None:
                os.rename(aside, path)  # a live run took it over first: its lock goes back
                raise WorkdirBusy(_busy_message(workdir, moved))
            os.remove(aside)
    else:
        with contextlib.suppress(FileNotFoundError):
            storage.remove(path)
    if not _create(path, owner):
        raise WorkdirBusy(_busy_message(workdir, read(workdir) or {}))


def _read_local(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}


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


def _busy_message(workdir: str, owner: dict) -> str:
    who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, since {owner.get('started', '?')}"
    if not owner:
        who = "its lock is being written this instant"
    elif not _same_pid_namespace(owner):
        who = f"pid {owner.get('pid', '?')} in another container on {owner['host']}, since {owner.get('started', '?')}"
    return (f"{_console.argument('workdir', workdir)} is in use by another training ({who}): wait for it to end "
            f"or give another {_console.either('--workdir', 'workdir')} (if that run is gone, delete its {LOCK_FILE})."
            )



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
