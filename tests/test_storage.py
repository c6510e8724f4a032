"""keras_vit.utils.storage: one atomic writer, and run folders / image folders on any
tf.io.gfile filesystem (TensorFlow's in-memory ram:// stands in for gs://)."""

import errno
import os
import stat
import subprocess
import sys
import uuid

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import images, runs
from keras_vit.utils import storage
from tests import image_files
from tests.conftest import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def ram():
    """A fresh, existing folder on ram:// (one filesystem for the whole process), removed afterwards."""
    root = f"ram://test-{uuid.uuid4().hex}"
    storage.makedirs(root)
    yield root
    tf.io.gfile.rmtree(root)


def _full_disk(f):
    f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


# --- local files: as before ----------------------------------------------------------------------------------

def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    storage.write_text(tmp_path / "a.json", "{}")
    with pytest.raises(OSError, match="No space"):
        storage.write_bytes(tmp_path / "a.json", _full_disk)
    assert (tmp_path / "a.json").read_text() == "{}"
    assert os.listdir(tmp_path) == ["a.json"]


def test_new_files_get_the_umask_permissions_without_asking_os_umask(tmp_path, monkeypatch):
    previous = os.umask(0o022)
    try:
        # os.umask(0) to read the mask races with other threads creating files: never called.
        monkeypatch.setattr(os, "umask", lambda mask: pytest.fail("os.umask called"))
        storage.write_text(tmp_path / "a.json", "{}")
        assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o644
        monkeypatch.undo()
        os.umask(0o077)
        storage.write_bytes(tmp_path / "b.bin", b"\x00")
        assert stat.S_IMODE(os.stat(tmp_path / "b.bin").st_mode) == 0o600
    finally:
        os.umask(previous)


class _Model:
    """What save_keras_model needs of a Keras model: save(path)."""

    def __init__(self, content, fail=False):
        self.content, self.fail, self.saved_to = content, fail, None

    def save(self, path):
        self.saved_to = path
        with open(path, "wb") as f:
            f.write(self.content)
        if self.fail:
            raise RuntimeError("killed while saving")


def test_a_failed_model_save_keeps_the_previous_model(tmp_path):
    path = tmp_path / "model.keras"
    storage.save_keras_model(_Model(b"old"), path)
    failing = _Model(b"half", fail=True)
    with pytest.raises(RuntimeError):
        storage.save_keras_model(failing, path)
    assert failing.saved_to.endswith(".keras")  # Keras refuses other names
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.keras"]


def test_local_runs_never_start_tensorflow(tmp_path):
    script = ("import sys, keras_vit_cli  # as the command line imports keras_vit\nfrom keras_vit import runs\n"
              f"runs.write_results({str(tmp_path)!r}, {{'status': 'finished'}})\n"
              f"runs.write_labels({str(tmp_path)!r}, None, 2)\n"
              f"assert runs.read_results({str(tmp_path)!r}) == {{'status': 'finished'}}\n"
              f"assert runs.find_labels({str(tmp_path)!r}) == ['0', '1']\n"
              "print('tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


# --- remote paths --------------------------------------------------------------------------------------------

def test_remote_paths_are_told_apart_and_split_with_slashes():
    assert storage.is_remote("ram://a") and storage.is_remote("gs://b/c")
    assert not storage.is_remote("/tmp/a") and not storage.is_remote("runs/a") and not storage.is_remote("C:\\x")
    assert storage.join("gs://b", "run", "model.keras") == "gs://b/run/model.keras"
    assert storage.dirname("gs://b/run/model.keras") == "gs://b/run"
    assert storage.dirname("ram://top") == "ram://"
    assert storage.basename("gs://b/run/") == "run"
    assert storage.abspath("gs://b/run") == "gs://b/run"


def test_remote_round_trip(ram):
    folder = storage.join(ram, "sub")
    storage.makedirs(folder)
    storage.write_bytes(storage.join(folder, "a.bin"), b"\x00\x01")
    storage.write_text(storage.join(folder, "b.txt"), "caf\u00e9\r\nx")
    storage.write_bytes(storage.join(folder, "c.npz"), lambda f: np.savez(f, x=np.arange(3)))  # needs seek
    assert sorted(storage.listdir(folder)) == ["a.bin", "b.txt", "c.npz"]  # no temporaries
    assert storage.listdir(ram) == ["sub"]
    assert storage.read_bytes(storage.join(folder, "a.bin")) == b"\x00\x01"
    assert storage.read_text(storage.join(folder, "b.txt")) == "caf\u00e9\nx"
    with storage.open(storage.join(folder, "c.npz"), "rb") as f, np.load(f) as data:
        np.testing.assert_array_equal(data["x"], np.arange(3))
    assert storage.glob(storage.join(folder, "*.txt")) == [storage.join(folder, "b.txt")]
    assert storage.glob(storage.join(ram, "missing", "*")) == []
    assert storage.getsize(storage.join(folder, "a.bin")) == 2
    assert storage.isdir(folder) and not storage.isfile(folder)
    assert storage.isfile(storage.join(folder, "a.bin")) and not storage.isdir(storage.join(folder, "a.bin"))
    storage.remove(storage.join(folder, "a.bin"))
    assert not storage.exists(storage.join(folder, "a.bin")) and not storage.isfile(storage.join(folder, "a.bin"))


def test_remote_failures_are_os_errors_and_keep_the_old_file(ram):
    path = storage.join(ram, "a.json")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(path)
    with pytest.raises(FileNotFoundError):
        storage.listdir(storage.join(ram, "missing"))
    storage.write_text(path, "{}")
    with pytest.raises(OSError, match="No space"):
        storage.write_bytes(path, _full_disk)

    def quota(f):
        raise tf.errors.ResourceExhaustedError(None, None, "quota exceeded")

    with pytest.raises(OSError, match="quota exceeded") as raised:
        storage.write_bytes(path, quota)
    assert raised.value.errno == errno.ENOSPC
    assert storage.read_text(path) == "{}" and storage.listdir(ram) == ["a.json"]


def test_a_run_folder_on_remote_storage(ram):
    work = storage.join(ram, "run")
    storage.makedirs(work)
    assert runs.read_results(work) == {} and runs.find_labels(work) is None
    runs.write_config(work, {"seed": 1})
    runs.write_results(work, {"status": "finished", "steps": 5, "class_names": ["p", "q"]})
    assert runs.read_config(work) == {"seed": 1}
    assert runs.read_results(work)["steps"] == 5
    assert runs.find_labels(work) == ["p", "q"]
    runs.write_labels(work, ["cat", "dog"], 2)
    assert runs.find_labels(work) == ["cat", "dog"]
    assert runs.read_labels(storage.join(work, runs.LABELS_FILE)) == ["cat", "dog"]
    assert not runs.is_finished(work, 5)  # no model yet
    with pytest.raises(runs.ModelFileError, match="has no model.keras"):
        runs.load_model(work)
    with pytest.raises(runs.ModelFileError, match="does not exist"):
        runs.load_model(storage.join(work, "other.keras"))


def test_a_model_saved_on_remote_storage_loads_by_workdir_and_file(ram, rng):
    work = storage.join(ram, "run")
    storage.makedirs(work)
    model = keras_vit.ViT(tiny_config(), image_size=8, num_classes=2, num_channels=1)
    path = runs.save_model(work, model)
    runs.write_labels(work, ["cat", "dog"], 2)
    runs.write_results(work, {"status": "finished", "steps": 3})
    assert path == storage.join(work, runs.MODEL_FILE)
    assert sorted(storage.listdir(work)) == ["labels.txt", "model.keras", "results.json"]  # no temporaries
    assert runs.is_finished(work, 3)
    images_in = rng.uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    for source in (work, path):
        loaded = runs.load_model(source)
        np.testing.assert_allclose(np.asarray(loaded(images_in)), np.asarray(model(images_in)), atol=1e-6)
        assert runs.workdir_of(source) == work and runs.find_labels(source) == ["cat", "dog"]
    storage.write_bytes(storage.join(work, "bad.keras"), b"not a zip")
    with pytest.raises(runs.ModelFileError, match="bad.keras' exists but cannot be read.*not a zip"):
        runs.load_model(storage.join(work, "bad.keras"))

    from keras_vit.export import pipeline, source as source_lib

    resolved = source_lib.resolve(work)  # `keras-vit export ram://...`
    assert resolved.name == "run" and resolved.labels == ["cat", "dog"]
    assert pipeline._source_size(work) == storage.getsize(path) > 0


def _manager_and_state(workdir, keep=2):
    from keras_vit.training.checkpointing import CheckpointManager

    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return CheckpointManager(workdir, {"task": "classification"}, keep=keep), model, optimizer


def test_checkpoints_on_remote_storage(ram, monkeypatch):
    from keras_vit.training.checkpointing import CheckpointWriteError

    manager, model, optimizer = _manager_and_state(storage.join(ram, "run"))
    for step in (1, 2, 3):
        manager.save(step, 16 * step, model, optimizer)
    assert manager.steps() == [2, 3]  # the oldest removed
    saved = [np.asarray(v) for v in model.variables]
    for v in model.variables:
        v.assign(np.zeros(v.shape, v.dtype))
    assert manager.restore(model, optimizer) == (3, 48)
    for before, after in zip(saved, model.variables):
        np.testing.assert_array_equal(before, np.asarray(after))

    def quota(*args, **kwargs):  # the store refuses the upload: a tf.errors, not an OSError
        raise tf.errors.ResourceExhaustedError(None, None, "quota exceeded")

    monkeypatch.setattr(np, "savez", quota)
    with pytest.raises(CheckpointWriteError, match=r"quota exceeded.*ckpt-00000003\.npz\) is intact"):
        manager.save(4, 64, model, optimizer)
    assert manager.steps() == [2, 3]


def test_image_folders_on_remote_storage(ram):
    local = image_files.picture()
    folder = storage.join(ram, "cats")
    storage.makedirs(storage.join(folder, "nested.png"))  # a folder with an image's name is no image
    storage.write_bytes(storage.join(folder, "b.png"), image_files.encoded(local, "PNG"))
    storage.write_bytes(storage.join(folder, "a.jpg"), image_files.encoded(local, "JPEG", quality=95))
    storage.write_bytes(storage.join(folder, "broken.png"), b"\x89PNG\r\n\x1a\nnot really")
    storage.write_bytes(storage.join(folder, ".hidden.png"), image_files.encoded(local, "PNG"))
    storage.write_bytes(storage.join(folder, "notes.txt"), b"text")
    listed = images.list_images(folder)
    assert listed == [storage.join(folder, n) for n in ("a.jpg", "b.png", "broken.png")]
    np.testing.assert_array_equal(images.decode(listed[1]), local)
    assert images.decode(listed[0], num_channels=1).shape == (*local.shape[:2], 1)
    assert [p for p, _ in images.find_unopenable(listed, progress=False)] == [listed[2]]
    with pytest.raises(FileNotFoundError):
        images.decode(storage.join(folder, "missing.png"))
    assert images.unreadable_reason(storage.join(folder, "missing.png"), None) == "no such file"


def test_export_validation_data_on_remote_storage(ram):
    from keras_vit.export import data as export_data

    for label, seed in (("a", 0), ("b", 1)):
        storage.makedirs(storage.join(ram, label))
        png = image_files.encoded(image_files.picture(seed=seed), "PNG")
        storage.write_bytes(storage.join(ram, label, "x.png"), png)
    storage.write_bytes(storage.join(ram, "pixels.npz"), lambda f: np.savez(f, images=np.zeros((2, 8, 8, 3))))
    loaded = export_data.load(ram, (8, 8), 3)
    assert loaded.images.shape == (2, 8, 8, 3) and list(loaded.labels) == [0, 1]
    assert export_data.load(storage.join(ram, "pixels.npz"), (8, 8), 3).images.shape == (2, 8, 8, 3)


@pytest.mark.slow
def test_train_resume_and_export_with_the_workdir_and_the_images_on_ram(ram, tmp_path):
    # Issue #21 item 5: a whole round trip on a non-local filesystem.
    from keras_vit import export as export_lib
    from keras_vit import training
    from tests import image_files
    from tests.training_helpers import tiny_config

    data = storage.join(ram, "photos")
    for c, name in enumerate(("red", "blue")):
        storage.makedirs(storage.join(data, name))  # ram:// lists only folders made as such (gs:// any prefix)
        for i in range(10):
            pixels = image_files.picture(seed=10 * c + i)
            pixels[..., c * 2] = 255
            storage.write_bytes(storage.join(data, name, f"{i}.png"), image_files.encoded(pixels, "PNG"))
    work = storage.join(ram, "run")
    config = tiny_config(work, dataset=f"folder:{data}", image_size=14, batch_size=6, steps=2, checkpoint_every=2,
                         eval_batch_size=2)
    first = training.train(config)
    assert first["steps"] == 2 and storage.exists(storage.join(work, "checkpoints", "ckpt-00000002.npz"))
    resumed = training.train(config.replace(steps=4))
    assert resumed["steps"] == 4 and resumed["steps_this_session"] == 2
    assert [s["start_step"] for s in resumed["segments"]] == [0, 2]
    assert sorted(storage.listdir(storage.join(work, "checkpoints"))) == ["ckpt-00000002.npz", "ckpt-00000004.npz"]
    assert runs.find_labels(work) == ["blue", "red"]
    report = export_lib.export(work, formats=["saved_model"], out=str(tmp_path / "exports"),
                               verbose=False)
    assert all(row["passed"] for row in report["artifacts"]), report


# --- folders, written as one unit ------------------------------------------------------------------------------

def _fill(folder, files):
    for name, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
            f.write(content)


def _read_tree(root):
    """{relative path: content} of every file under a local or remote folder."""
    found = {}
    for folder, _, files in tf.io.gfile.walk(root):
        for name in files:
            relative = (folder[len(root):].strip("/") + "/" + name).lstrip("/")
            found[relative] = storage.read_text(storage.join(folder, name))
    return found


OLD = {"a.txt": "old a", "sub/b.txt": "old b", "stale.txt": "only in the old"}
NEW = {"a.txt": "new a", "sub/b.txt": "new b", "sub/deeper/c.txt": "new c"}


def test_a_folder_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path):
    target = tmp_path / "out"
    with storage.writing_directory(target) as folder:
        assert os.listdir(folder) == [] and os.path.dirname(folder) == str(tmp_path)
        _fill(folder, OLD)
    assert _read_tree(str(target)) == OLD
    with storage.writing_directory(str(target)) as folder:
        _fill(folder, NEW)
    assert _read_tree(str(target)) == NEW  # replaced, not merged: stale.txt is gone
    assert os.listdir(tmp_path) == ["out"]


def test_a_failure_inside_keeps_the_old_folder_and_removes_the_temporary(tmp_path):
    target = tmp_path / "out"
    with storage.writing_directory(target) as folder:
        _fill(folder, OLD)
    with pytest.raises(OSError, match="No space"):
        with storage.writing_directory(target) as folder:
            _fill(folder, {"a.txt": "half"})
            raise OSError(errno.ENOSPC, "No space left on device")
    assert _read_tree(str(target)) == OLD and os.listdir(tmp_path) == ["out"]
    with pytest.raises(KeyboardInterrupt):  # an interrupt too
        with storage.writing_directory(target) as folder:
            raise KeyboardInterrupt
    assert _read_tree(str(target)) == OLD and os.listdir(tmp_path) == ["out"]


def test_a_failed_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "out"
    with storage.writing_directory(target) as folder:
        _fill(folder, OLD)
    rename = os.rename

    def refuse_the_new(source, destination):
        if ".tmp" in os.path.basename(source):
            raise PermissionError(errno.EACCES, "Permission denied")
        rename(source, destination)

    monkeypatch.setattr(os, "rename", refuse_the_new)
    with pytest.raises(PermissionError):
        with storage.writing_directory(target) as folder:
            _fill(folder, NEW)
    assert _read_tree(str(target)) == OLD and os.listdir(tmp_path) == ["out"]


def test_readers_never_see_a_half_written_folder(tmp_path, monkeypatch):
    # Every state the target passes through, recorded at each file write and rename.
    target, seen = tmp_path / "out", []
    with storage.writing_directory(target) as folder:
        _fill(folder, OLD)
    rename = os.rename

    def watched(source, destination):
        seen.append(_read_tree(str(target)) if target.exists() else None)
        rename(source, destination)
        seen.append(_read_tree(str(target)) if target.exists() else None)

    monkeypatch.setattr(os, "rename", watched)
    with storage.writing_directory(target) as folder:
        for name, content in NEW.items():
            _fill(folder, {name: content})
            seen.append(_read_tree(str(target)))
    assert all(state in (OLD, NEW, None) for state in seen), seen
    assert seen[-1] == NEW


def test_every_file_is_fsynced_before_the_folder_appears(tmp_path, monkeypatch):
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))[1])
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc to name a descriptor")
    with storage.writing_directory(tmp_path / "out") as folder:
        _fill(folder, NEW)
        staging = folder
    assert {os.path.relpath(p, staging) for p in synced if p.startswith(staging + os.sep)} >= set(NEW)


def test_a_new_folder_gets_the_umask_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        with storage.writing_directory(tmp_path / "out") as folder:
            _fill(folder, {"a.txt": "x"})
        assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == 0o755  # not mkdtemp's 0700
    finally:
        os.umask(previous)


def test_a_file_where_the_folder_goes_is_refused_and_kept(tmp_path):
    (tmp_path / "out").write_text("mine")
    with pytest.raises(NotADirectoryError):
        with storage.writing_directory(tmp_path / "out"):
            pytest.fail("never reached")
    assert (tmp_path / "out").read_text() == "mine"


def test_a_remote_folder_is_written_replaced_and_kept_on_failure(ram):
    target = storage.join(ram, "out")
    with storage.writing_directory(target) as folder:
        assert not storage.is_remote(folder)  # a local folder, for writers that need one
        _fill(folder, OLD)
    assert _read_tree(target) == OLD
    with pytest.raises(RuntimeError):
        with storage.writing_directory(target) as folder:
            _fill(folder, NEW)
            raise RuntimeError("killed")
    assert _read_tree(target) == OLD and storage.listdir(ram) == ["out"]
    with storage.writing_directory(target) as folder:
        _fill(folder, NEW)
    assert _read_tree(target) == NEW and storage.listdir(ram) == ["out"]


def test_a_failed_upload_keeps_the_remote_folder(ram, monkeypatch):
    target = storage.join(ram, "out")
    with storage.writing_directory(target) as folder:
        _fill(folder, OLD)

    def quota(*args, **kwargs):  # the store refuses the upload: a tf.errors, raised as an OSError
        raise tf.errors.ResourceExhaustedError(None, None, "quota exceeded")

    monkeypatch.setattr(storage.shutil, "copyfileobj", quota)
    with pytest.raises(OSError, match="quota exceeded"):
        with storage.writing_directory(target) as folder:
            _fill(folder, NEW)
    monkeypatch.undo()
    assert _read_tree(target) == OLD and storage.listdir(ram) == ["out"]


def test_a_file_of_names_reads_alike_wherever_it_lies_and_however_it_was_saved(tmp_path, ram):
    # Notepad's byte-order mark, Windows' line ends, a blank line and padding: the names alone.
    content = "\ufeffcat\r\n  dog \r\n\r\nbird\n".encode("utf-8")
    for root in (str(tmp_path), ram):
        storage.write_bytes(storage.join(root, "classes.txt"), content)
        assert storage.read_lines(storage.join(root, "classes.txt")) == ["cat", "dog", "bird"]
