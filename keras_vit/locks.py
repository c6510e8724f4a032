"""One writer per workdir: a lock file taken before a run writes anything.

    with locks.held("runs/demo"):   # WorkdirBusy (a UserError) if another run holds it
        ...train...

TensorFlow's checkpoints, results.json and model.keras all assume one writer:
two runs on one workdir would each overwrite the other's files and both
report success. The lock is `<workdir>/.keras-vit.lock`, a small JSON file
naming its owner (host, pid, start time, command):

- Locally it is created with O_CREAT|O_EXCL, which only one process can win.
  It is deleted when the run ends, however it ends (a finished run, an
  exception, Ctrl-C, SIGTERM). After kill -9 or a crash the file stays; the
  next run sees that its owner's process is gone (same host, no such pid)
  and takes it over.
- On gs://-style storage (anything keras_vit.storage reaches through
  tf.io.gfile) there is no exclusive create: the lock is written whole (an
  object appears whole) after checking that none exists, then read back to
  check it is ours, so two runs started within the same instant could still
  both pass. A lock of this host is stale when its pid is gone, as locally;
  one written by another host cannot be checked from here, so it is refused
  with the way out: delete the lock file once that run is known to be gone.
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

from keras_vit import _console, storage
from keras_vit.errors import UserError

LOCK_FILE = ".keras-vit.lock"


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
    owner = this_process()
    try:
        storage.makedirs(workdir)
        if _create(lock_path(workdir), owner):
            return owner
        current = read(workdir)
        if current is not None and not is_stale(current):
            raise WorkdirBusy(_busy_message(workdir, current))
        _take_over(workdir, current, owner)
    except OSError as error:
        raise UserError(f"{_console.argument('workdir', workdir)} cannot be written ({error.strerror or error}): "
                        f"give a folder this user can write.") from None
    return owner


def release(workdir: str, owner: dict) -> None:
    """Deletes the lock if it is still `owner`'s (one taken over meanwhile is left alone)."""
    with contextlib.suppress(OSError):
        if read(workdir) == owner:
            storage.remove(lock_path(workdir))


def read(workdir: str) -> Optional[dict]:
    """The lock's owner, None when there is no lock; {} when it cannot be parsed (a partial write: stale)."""
    try:
        return json.loads(storage.read_text(lock_path(workdir)))
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return {}


def is_stale(owner: dict) -> bool:
    """Whether the owner is known to be gone: this host and no such process (or an unreadable lock)."""
    if not owner.get("pid") or not owner.get("host"):
        return True
    if owner["host"] != socket.gethostname():
        return False  # another machine's process cannot be asked from here
    return not _alive(int(owner["pid"]))


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

def this_process() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200],
            "token": secrets.token_hex(8)}


def _create(path: str, owner: dict) -> bool:
    """Creates the lock file holding `owner`; False if one exists already."""
    text = json.dumps(owner)
    if storage.is_remote(path):
        if storage.exists(path):
            return False
        storage.write_text(path, text)
        return json.loads(storage.read_text(path)) == owner  # another writer's came last: not ours
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return True


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
    return (f"{_console.argument('workdir', workdir)} is in use by another training ({who}): wait for it to end "
            f"or give another {_console.either('--workdir', 'workdir')} (if that run is gone, delete its {LOCK_FILE})."
            )


def _remove_empty_folder(path: str) -> None:
    if storage.is_remote(path):
        return  # an object store has no empty folders to leave behind
    os.rmdir(path)
