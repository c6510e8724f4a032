"""Where an export goes: the `out` folder, checked before any work, and the
new export installed there as one unit once it is built and validated.

`out` holds one export. Everything is built and validated in a hidden
staging folder beside it (same filesystem), then installed through
keras_vit.storage.writing_directory: the previous export is replaced whole
(or left as it was if anything fails), never merged with the new one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

from keras_vit import _console, storage
from keras_vit.export.registry import ExportError

REPORT_FILE = "report.json"
LABELS_FILE = "labels.txt"
STAGING_PREFIX = ".export-"  # older exports staged inside `out`: an interrupted one's leftover is ignored


def check_out(out: str, overwrite: bool) -> bool:
    """Refuses, before any work, an `out` that is (or lies under) a file, a
    folder holding something that is not an export, and one holding an
    export unless `overwrite`. Returns whether an export is being replaced."""
    blocker = _file_on_the_way(out)
    if blocker is not None:
        where = "" if blocker == os.path.abspath(out) else f" ({blocker!r} is a file)"
        raise ExportError(f"{_console.argument('out', out)} is not a folder{where}: give a folder for the export "
                          f"(it is created if missing).")
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


def make_staging(out: str) -> str:
    """A hidden folder beside `out` (so that installing is a rename), removed by the caller."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}{STAGING_PREFIX}", dir=parent)


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
