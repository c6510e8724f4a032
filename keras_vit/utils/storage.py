"""Files on any filesystem TensorFlow reaches: local paths, gs://, ram:// (tests), ...

A path with a URL scheme ("gs://bucket/run", "ram://run") goes through
tf.io.gfile; any other path through os and the builtin open, exactly as
before. TensorFlow is imported only when a path has a scheme, so code that
only touches local files (the command line describing itself, keras_vit.runs)
never starts it. Remote failures are raised as OSError (FileNotFoundError,
PermissionError, ...), as local ones are, so callers catch one kind.

Every write goes through one of two atomic writers: `write_bytes` for a file
(and `write_text`, `save_keras_model` on top of it), `writing_directory` for a
folder of files. The new content is complete under a temporary name beside the
target before it takes the target's place, so a failure (a full disk, a crash,
a lost connection) leaves the previous file or folder and no partial one.
Locally the data is fsynced first and the rename is atomic; on an object store
a file appears whole, as objects always do. Nothing here changes the umask.

This module imports nothing of keras_vit: everything else builds on it.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import glob as _glob
import os
import posixpath
import re
import secrets
import shutil
import tempfile
import time
from typing import Callable, Iterator, List, Union

PathLike = Union[str, os.PathLike]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_COPY_CHUNK = 1 << 22  # 4 MiB: few round trips to an object store, little memory
# tf.errors class name -> the errno of the OSError subclass it becomes.
_ERRNO = {"NotFoundError": errno.ENOENT, "PermissionDeniedError": errno.EACCES,
          "AlreadyExistsError": errno.EEXIST, "ResourceExhaustedError": errno.ENOSPC}


# --- paths ----------------------------------------------------------------------------------------------

def is_remote(path: PathLike) -> bool:
    """Whether `path` has a URL scheme ("gs://", "ram://", ...), i.e. goes through tf.io.gfile."""
    return isinstance(path, (str, os.PathLike)) and bool(_SCHEME.match(os.fspath(path)))


def join(path: PathLike, *names: str) -> str:
    """`path`/`names`, with "/" on remote paths whatever the local separator."""
    path = os.fspath(path)
    return posixpath.join(path, *names) if is_remote(path) else os.path.join(path, *names)


def abspath(path: PathLike) -> str:
    """The absolute form of a local path; a remote path as it is (it is absolute)."""
    path = os.fspath(path)
    return path if is_remote(path) else os.path.abspath(path)


def dirname(path: PathLike) -> str:
    """The folder part of `path` ("ram://a/b" -> "ram://a", "ram://b" -> "ram://")."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.dirname(path)
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{posixpath.dirname(rest.rstrip('/'))}"


def basename(path: PathLike) -> str:
    """The last part of `path` ("ram://a/b/" -> "b": a remote folder may be named with a trailing "/")."""
    path = os.fspath(path)
    return posixpath.basename(path.split("://", 1)[1].rstrip("/")) if is_remote(path) else os.path.basename(path)


# --- asking -------------------------------------------------------------------------------------------------

def exists(path: PathLike) -> bool:
    """Whether `path` exists (False, not an error, when it cannot be asked: as os.path.exists)."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.exists(path)
    with contextlib.suppress(OSError), _os_errors(path):
        return _gfile().exists(path)
    return False


def isdir(path: PathLike) -> bool:
    """Whether `path` is a folder (False when it cannot be asked, as os.path.isdir)."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.isdir(path)
    with contextlib.suppress(OSError), _os_errors(path):
        return _gfile().isdir(path)
    return False


def isfile(path: PathLike) -> bool:
    """Whether `path` is a file (False when it cannot be asked, as os.path.isfile)."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.isfile(path)
    with contextlib.suppress(OSError), _os_errors(path):
        return not _gfile().stat(path).is_directory
    return False


def getsize(path: PathLike) -> int:
    """The size of the file `path` in bytes."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.getsize(path)
    with _os_errors(path):
        return int(_gfile().stat(path).length)


def getmtime(path: PathLike) -> float:
    """When file `path` last changed, in seconds since the epoch (as os.path.getmtime)."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.getmtime(path)
    with _os_errors(path):
        return _gfile().stat(path).mtime_nsec / 1e9


def listdir(path: PathLike) -> List[str]:
    """The names in folder `path` (unsorted, as os.listdir)."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.listdir(path)
    with _os_errors(path):
        # Object stores (GCS) name sub-folders "sub/".
        return [name.rstrip("/") for name in _gfile().listdir(path)]


def glob(pattern: PathLike) -> List[str]:
    """The paths matching `pattern` (unsorted); [] when its folder does not exist, as glob.glob."""
    pattern = os.fspath(pattern)
    if not is_remote(pattern):
        return _glob.glob(pattern)
    with contextlib.suppress(FileNotFoundError), _os_errors(pattern):
        return list(_gfile().glob(pattern))
    return []


def unwritable(path: PathLike) -> Union[str, None]:
    """Why folder `path` (existing or to be made) cannot be written, in a few
    words; None when it can, as far as can be told before writing: a file on
    the way, or a nearest existing folder this user cannot write (read-only
    filesystem, permissions). A remote path is not asked (it fails on write)."""
    path = os.fspath(path)
    if is_remote(path):
        return None
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path!r} is a file"
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):  # Windows has no statvfs
        read_only = False
    if read_only:
        return f"{path!r} is on a read-only filesystem"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"this user cannot write in {path!r}"
    return None


# --- changing ---------------------------------------------------------------------------------------------

def makedirs(path: PathLike) -> None:
    """Creates folder `path` and its parents; nothing when it exists."""
    path = os.fspath(path)
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
        return
    with _os_errors(path):
        _gfile().makedirs(path)


def remove(path: PathLike) -> None:
    """Deletes the file `path`."""
    path = os.fspath(path)
    if not is_remote(path):
        os.remove(path)
        return
    with _os_errors(path):
        _gfile().remove(path)


# --- reading ---------------------------------------------------------------------------------------------

def open(path: PathLike, mode: str = "r"):  # noqa: A001 - the builtin's name, on purpose
    """A file object for `path`: the builtin open locally (text as UTF-8),
    tf.io.gfile.GFile remotely. A remote file fails lazily, with tf.errors,
    on its first read or write: use read_bytes/read_text/write_bytes for
    OSErrors. Remote files in "w" mode cannot seek (write_bytes can)."""
    path = os.fspath(path)
    if is_remote(path):
        return _gfile().GFile(path, mode)
    return builtins.open(path, mode) if "b" in mode else builtins.open(path, mode, encoding="utf-8")


def read_bytes(path: PathLike) -> bytes:
    """The whole content of file `path`."""
    path = os.fspath(path)
    with _os_errors(path), open(path, "rb") as f:
        return f.read()


def read_text(path: PathLike) -> str:
    """The whole content of file `path`, decoded as UTF-8, with "\\r\\n" and
    "\\r" read as "\\n" (as the builtin open's text mode reads them)."""
    return read_bytes(path).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def read_lines(path: PathLike) -> List[str]:
    """The non-blank lines of text file `path`, stripped, a UTF-8 byte-order mark dropped: a file of
    names, one a line (classes.txt, labels.txt, --labels FILE)."""
    return [line.strip() for line in read_text(path).lstrip("\ufeff").splitlines() if line.strip()]


@contextlib.contextmanager
def local_copy(path: PathLike) -> Iterator[str]:
    """A local path with the content of `path`, for readers that need one (Keras,
    zipfile): `path` itself when local; for a remote path a temporary copy with
    the same name, deleted when the `with` ends."""
    path = os.fspath(path)
    if not is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="keras_vit-") as folder:
        local = os.path.join(folder, basename(path))
        with _os_errors(path), open(path, "rb") as source, builtins.open(local, "wb") as target:
            shutil.copyfileobj(source, target, _COPY_CHUNK)
        yield local


# --- writing (atomically) ------------------------------------------------------------------------------

def write_bytes(path: PathLike, content: Union[bytes, Callable]) -> None:
    """Writes file `path` atomically: `content` is the bytes, or a function
    `write(fileobj)` that writes them (e.g. `lambda f: np.savez(f, **arrays)`).

    The file is complete under a temporary name in the same folder before it
    is renamed over `path`, so a failure leaves the previous file and no
    temporary. A new local file gets the permissions the umask (or a default
    ACL) gives any new file. Remotely, `write` gets a local seekable file
    (gfile writers cannot seek, and zip writers need to) that is then
    uploaded in one piece."""
    write = content if callable(content) else (lambda f: f.write(content))
    path = os.fspath(path)
    if is_remote(path):
        def fill(temporary):
            with tempfile.TemporaryFile() as local:
                write(local)
                local.seek(0)
                with open(temporary, "wb") as remote:
                    shutil.copyfileobj(local, remote, _COPY_CHUNK)
    else:
        def fill(temporary):
            with builtins.open(temporary, "wb") as f:
                write(f)
    _atomically(path, fill)


def write_text(path: PathLike, text: str) -> None:
    """Writes `text` as UTF-8 to file `path`, atomically (see write_bytes)."""
    write_bytes(path, text.encode("utf-8"))


def save_keras_model(model, path: PathLike) -> str:
    """Saves `model` as the `.keras` file `path`, atomically (see write_bytes);
    returns `path`. Keras writes to a local path, so a remote model is saved to
    a local temporary file first and uploaded."""
    path = os.fspath(path)
    if not is_remote(path):
        _atomically(path, model.save, suffix=".keras")  # Keras insists on the extension
        return path
    with tempfile.TemporaryDirectory(prefix="keras_vit-") as folder:
        local = os.path.join(folder, "model.keras")
        model.save(local)
        with builtins.open(local, "rb") as f:
            write_bytes(path, lambda remote: shutil.copyfileobj(f, remote, _COPY_CHUNK))
    return path


def _atomically(path: str, fill: Callable[[str], None], suffix: str = ".tmp") -> None:
    """`fill(temporary)` writes a temporary file beside `path`, which then replaces `path`."""
    temporary = _sibling(path, suffix.lstrip("."))
    if is_remote(path):
        with _os_errors(path), _removed_on_failure(temporary):
            fill(temporary)
            _gfile().rename(temporary, path, overwrite=True)
        return
    # O_EXCL with 0o666: the kernel applies the umask (or default ACL) as for
    # any new file; mkstemp's 0600 would need the umask, which only
    # os.umask(0) tells, racing with other threads creating files meanwhile.
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    with _removed_on_failure(temporary):
        fill(temporary)
        _fsync(temporary)  # the data on disk before the rename makes it visible
        os.replace(temporary, path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDWR)  # writable: Windows refuses to flush a read-only descriptor
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(path: str) -> None:
    """Makes the names in folder `path` durable (POSIX); Windows cannot open a folder, and needs not."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _removed_on_failure(temporary: str):
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            if exists(temporary):
                remove(temporary)
        raise


@contextlib.contextmanager
def writing_directory(path: PathLike) -> Iterator[str]:
    """Writes folder `path` as one unit: yields an empty local folder to fill;
    when the `with` block ends without an error, that folder replaces `path`
    whole (an existing `path` and everything in it is replaced, not merged).

        with storage.writing_directory("export/saved_model") as folder:
            model.export(folder)

    If the block (or the swap) fails, `path` is left as it was and the
    temporary is removed. Locally the temporary is a hidden sibling of `path`
    (made with the umask's permissions), every file and folder in it is
    fsynced, then the old `path` is renamed aside, the new one renamed in
    and the old one deleted: a reader sees the old folder or the new one
    whole (or, between the two renames, none), never a part. Remotely
    (gs://, ram://) the block fills a local temporary folder that is uploaded
    beside `path` and then moved in file by file: an object store has no
    folder rename, so readers can see a mix during that last move only."""
    path = os.fspath(path)
    if isfile(path):  # a file where a folder goes is a mistake: never delete it silently
        raise NotADirectoryError(errno.ENOTDIR, "exists and is a file, not a folder", path)
    if is_remote(path):
        with tempfile.TemporaryDirectory(prefix="keras_vit-") as local:
            yield local
            _upload_and_swap(local, path)
        return
    path = os.path.abspath(path)
    makedirs(os.path.dirname(path))
    staging = _sibling(path, "tmp")
    os.mkdir(staging, 0o777)  # the umask applies, as to any new folder (mkdtemp's 0700 would not)
    with _removed_tree_on_failure(staging):
        yield staging
        _fsync_tree(staging)
        _swap_local(staging, path)


def _sibling(path: str, kind: str) -> str:
    """A hidden name beside `path`: listings and globs of the parent folder skip it."""
    return join(dirname(path) or os.curdir, f".{basename(path)}.{secrets.token_hex(6)}.{kind}")


def _fsync_tree(root: str) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync(os.path.join(folder, name))
        _fsync_folder(folder)


def _swap_local(staging: str, path: str) -> None:
    """Renames `staging` to `path`; an existing `path` is renamed aside first and deleted after."""
    aside = _sibling(path, "old")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        aside = None  # nothing to replace
    try:
        os.rename(staging, path)
    except BaseException:
        if aside:
            os.rename(aside, path)  # put the old folder back before reporting the failure
        raise
    _fsync_folder(os.path.dirname(path))  # the renames themselves durable
    if aside:
        shutil.rmtree(aside, ignore_errors=True)  # the new folder is in place: a leftover is only waste


def _upload_and_swap(local: str, path: str) -> None:
    staging, aside = _sibling(path, "tmp"), _sibling(path, "old")
    with _os_errors(path):
        with _removed_tree_on_failure(staging):
            _copy_tree(local, staging)  # a failure here leaves `path` untouched
        had_old = exists(path)
        if had_old:
            _move_tree(path, aside)
        try:
            _move_tree(staging, path)
        except BaseException:
            if had_old:
                with contextlib.suppress(Exception):
                    _move_tree(aside, path)
            raise
        for leftover in ([aside] if had_old else []) + [staging]:
            with contextlib.suppress(Exception):
                _gfile().rmtree(leftover)


def _copy_tree(local: str, remote: str) -> None:
    for folder, _, files in os.walk(local):
        target = join(remote, *_parts(os.path.relpath(folder, local)))
        _gfile().makedirs(target)  # ram:// lists only folders made as such
        for name in files:
            with builtins.open(os.path.join(folder, name), "rb") as source, open(join(target, name), "wb") as out:
                shutil.copyfileobj(source, out, _COPY_CHUNK)


def _move_tree(source: str, target: str) -> None:
    """Moves remote folder `source` to `target` file by file (gfile renames
    folders on no object store whole; ram:// loses their content)."""
    for folder, _, files in list(_gfile().walk(source)):  # listed before anything moves
        relative = folder[len(source):].strip("/")
        destination = join(target, relative) if relative else target
        _gfile().makedirs(destination)
        for name in files:
            _gfile().rename(join(folder, name), join(destination, name), overwrite=True)
    _gfile().rmtree(source)


def _parts(relative: str) -> List[str]:
    return [] if relative == os.curdir else relative.split(os.sep)


@contextlib.contextmanager
def _removed_tree_on_failure(temporary: str):
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            if is_remote(temporary):
                _gfile().rmtree(temporary)
            else:
                shutil.rmtree(temporary)
        raise


# --- TensorFlow, only for remote paths ----------------------------------------------------------------------

def _gfile():
    import tensorflow as tf

    return tf.io.gfile


@contextlib.contextmanager
def _os_errors(path: str):
    """Raises tf.errors from gfile as the OSError a local failure would be."""
    if not is_remote(path):  # local calls raise OSErrors already; TensorFlow stays unloaded
        yield
        return
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as error:
        code = _ERRNO.get(type(error).__name__, errno.EIO)
        raise OSError(code, error.message or type(error).__name__, path) from error


def topmost_missing(path: PathLike) -> Union[str, None]:
    """The highest folder of `path` (itself included) that does not exist yet: what
    makedirs will make, for a caller that removes it again on failure. None when
    nothing is missing, or on an object store (it has no empty folders to leave)."""
    path = os.fspath(path)
    if is_remote(path):
        return None
    path, made = os.path.abspath(path), None
    while not os.path.exists(path) and os.path.dirname(path) != path:
        made, path = path, os.path.dirname(path)
    return made


def age_s(path: PathLike) -> float:
    """Seconds since `path` last changed; infinite when it is gone."""
    try:
        return time.time() - getmtime(path)
    except OSError:
        return float("inf")

