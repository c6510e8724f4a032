"""Where an export goes: the `out` folder, checked before any work, and the
new export installed there as one unit once it is built and validated.

`out` holds one export. Everything is built and validated in a hidden
staging folder beside it (same filesystem), then installed through
keras_vit.utils.storage.writing_directory: the previous export is replaced whole
(or left as it was if anything fails), never merged with the new one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import List, Optional, Tuple

from keras_vit.utils import console as _console, locks, storage
from keras_vit.export.registry import ExportError

REPORT_FILE = "report.json"
LABELS_FILE = "labels.txt"
STAGING_PREFIX = ".export-"  # older exports staged inside `out`: an interrupted one's leftover is ignored
OWNER_FILE = "owner.json"  # in a staging folder: the export process (host, pid) building it
STALE_AFTER_S = 3600  # a staging folder naming no owner is a leftover once unchanged this long


def check_out(out: str, overwrite: bool) -> bool:
    """Refuses, before any work, an `out` that is (or lies under) a file, a
    folder holding something that is not an export, and one holding an
    export unless `overwrite`. Returns whether an export is being replaced."""
    blocker = _file_on_the_way(out)
    if blocker is not None:
        where = "" if blocker == os.path.abspath(out) else f" ({blocker!r} is a file)"
        raise ExportError(f"{_console.argument('out', out)} is not a folder{where}: give a folder for the export "
                          f"(it is created if missing).")
    _check_writable(out)
    entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
    entries = [name for name in entries if not name.startswith(STAGING_PREFIX)]
    if not entries:
        return False
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    if REPORT_FILE not in entries:
        raise ExportError(f"{_console.argument('out', out)} holds files that are not an export ({shown}): "
                          f"export into a new or empty folder.")
    if not overwrite:
        raise ExportError(f"{_console.argument('out', out)} already holds an export ({shown}): add "
                          f"{_console.argument('overwrite')} to replace it as a whole, or choose another "
                          f"{_console.either('--out', 'out')}.")
    return True


def _check_writable(out: str) -> None:
    """The export is built beside `out` and renamed into place: its parent
    must be writable, and `out` must not be a mount point (no rename moves one)."""
    if os.path.ismount(os.path.abspath(out)):
        raise ExportError(f"{_console.argument('out', out)} is a mount point, which an export (replaced whole, by "
                          f"a rename) cannot be: give a folder inside it.")
    reason = storage.unwritable(os.path.dirname(os.path.abspath(out)))
    if reason is not None:
        raise ExportError(f"{_console.argument('out', out)} cannot be written ({reason}): give a folder this "
                          f"user can write.")


def _file_on_the_way(path) -> Optional[str]:
    """`path`, or the nearest of its parents that exists, when that is not a folder; else None."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return None if os.path.isdir(path) else path


def next_version(model_dir: str) -> int:
    """One above the highest SavedModel version in `model_dir` (TF Serving serves the highest); 1 if none."""
    if not os.path.isdir(model_dir):
        return 1
    versions = [int(d) for d in os.listdir(model_dir) if d.isdigit()]
    return max(versions, default=0) + 1


def make_staging(out: str) -> Tuple[str, Optional[str]]:
    """A hidden folder beside `out` (so that installing is a rename), made
    before any work (so an unwritable `out` is found first) and removed by
    `discard_staging`. It names its owner (OWNER_FILE), so that the next
    export of `out` can tell a killed export's leftover from a live one's.
    Returns it and the topmost folder made for it (None if none was)."""
    parent = os.path.dirname(os.path.abspath(out))
    made = storage.topmost_missing(parent)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=_staging_prefix(out), dir=parent)
        _write_owner(staging)
    except OSError as error:
        discard_staging(None, made)
        raise ExportError(f"{_console.argument('out', out)} cannot be written ({error.strerror or error}): give "
                          f"a folder this user can write.") from None
    return staging, made


def _write_owner(staging: str) -> None:
    """OWNER_FILE, written under another name and renamed: it appears whole,
    so another export never judges a live export by a half-written owner."""
    tmp = os.path.join(staging, f".{OWNER_FILE}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(locks.this_process(held=True), f)
    os.replace(tmp, os.path.join(staging, OWNER_FILE))


def discard_staging(staging: Optional[str], made: Optional[str]) -> None:
    """Removes `staging`, and the folders make_staging made (`made` and below) if nothing else went there."""
    if staging:
        shutil.rmtree(staging, ignore_errors=True)
    if made and os.path.isdir(made) and not any(files for _, _, files in os.walk(made)):
        shutil.rmtree(made, ignore_errors=True)


def remove_stale_staging(out: str) -> List[str]:
    """Removes the staging folders of earlier exports of `out` that were killed
    (kill -9, a crash): those whose owner process is gone, or that name no
    owner (older versions) and have not changed for STALE_AFTER_S seconds.
    Another target's, and a live export's, are left alone. Returns the removed."""
    parent = os.path.dirname(os.path.abspath(out))
    pattern = re.compile(re.escape(_staging_prefix(out)) + r"[a-z0-9_]{8}$")
    removed = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        path = os.path.join(parent, name)
        if pattern.match(name) and os.path.isdir(path) and _staging_is_stale(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _staging_prefix(out: str) -> str:
    return f".{os.path.basename(os.path.abspath(out))}{STAGING_PREFIX}"


def _staging_is_stale(path: str) -> bool:
    owner = os.path.join(path, OWNER_FILE)
    try:
        with open(owner, encoding="utf-8") as f:
            return locks.is_stale(json.load(f))
    except FileNotFoundError:  # no owner yet (being made this instant) or an older version's: by age
        return storage.age_s(path) > STALE_AFTER_S
    except (OSError, ValueError):  # unreadable: an older version's being written, or damaged
        return storage.age_s(owner) > locks.FRESH_S



def install(built: str, out: str) -> None:
    """Makes `out` hold exactly the export in `built` (storage.writing_directory:
    fsynced, swapped in whole, the previous export kept if anything fails)."""
    with storage.writing_directory(out) as folder:
        for name in os.listdir(built):
            os.rename(os.path.join(built, name), os.path.join(folder, name))


def discard(path: str, root: str) -> None:
    """Removes a failed artifact (a file or a folder), whatever was written of
    it, and the folders under `root` it leaves empty (a SavedModel's `<name>/`)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    parent = os.path.dirname(path)
    while parent != root and os.path.isdir(parent) and not os.listdir(parent):
        os.rmdir(parent)
        parent = os.path.dirname(parent)
