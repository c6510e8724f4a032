"""A folder's image embeddings, kept beside it so that a second search is instant.

The cache is FOLDER/.keras-vit-embeddings/MODEL_KEY.npz: each image's path (relative to the
folder), size and modification time, and its embedding. MODEL_KEY is a digest of what decides an
embedding: the checkpoint's config.json and weights file (size and time) and its image processor
settings, so another model, or the same one re-saved, never reads this one's vectors. A file
that changed, or is new, is embedded again; one that is gone is dropped. The file is written
whole (a temporary name, then renamed), so an interrupted search leaves the previous cache.
A folder that cannot be written is searched all the same, the cache skipped with one warning.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import List, Tuple

import numpy as np

from keras_vit.images import find_images
from keras_vit.utils import console as _console

CACHE_FOLDER = ".keras-vit-embeddings"


def model_key(model, processor) -> str:
    parts = {"processor": [processor.shortest_edge, processor.crop, processor.max_num_patches]}
    directory = getattr(model, "directory", None) or ""
    for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            stat = os.stat(path)
            parts[name] = [stat.st_size, stat.st_mtime_ns]
    if os.path.isfile(os.path.join(directory, "config.json")):
        with open(os.path.join(directory, "config.json"), "rb") as f:
            parts["config"] = hashlib.sha256(f.read()).hexdigest()
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _stamp(path: str) -> Tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def folder_embeddings(model, processor, folder: str, recursive: bool = False,
                      batch_size: int = 32) -> Tuple[List[str], np.ndarray, List[Tuple[str, str]], int]:
    """(image paths, their embeddings (N, E), [(path, reason)] unreadable, how many were embedded
    now rather than read from the cache)."""
    files = find_images([folder], recursive)
    cache = os.path.join(folder, CACHE_FOLDER, model_key(model, processor) + ".npz")
    known = _read_cache(cache, folder)
    paths, vectors, todo = [], [], []
    for path in files:
        entry = known.get(os.path.relpath(path, folder))
        if entry is not None and entry[0] == _stamp(path):
            paths.append(path)
            vectors.append(entry[1])
        else:
            todo.append(path)
    failures = []
    for start in range(0, len(todo), batch_size):
        inputs, read, failed = processor.read(todo[start:start + batch_size])
        failures += failed
        if read:
            paths += read
            vectors += list(model.image_embeddings(inputs))
    order = np.argsort(paths, kind="stable")
    paths = [paths[i] for i in order]
    embeddings = (np.stack([vectors[i] for i in order]) if vectors
                  else np.zeros((0, model.text_config.embedding_size), np.float32))
    if todo:
        _write_cache(cache, folder, paths, embeddings)
    return paths, embeddings, failures, len(todo) - len(failures)


def _read_cache(cache: str, folder: str) -> dict:
    if not os.path.isfile(cache):
        return {}
    try:
        with np.load(cache, allow_pickle=False) as saved:
            return {str(p): ((int(s), int(t)), e) for p, s, t, e in zip(saved["paths"], saved["sizes"],
                                                                      saved["mtimes"], saved["embeddings"])}
    except (OSError, ValueError, KeyError) as error:
        _console.warn(f"the embeddings cache {cache} cannot be read ({error}); embedding the folder again.")
        return {}


def _write_cache(cache: str, folder: str, paths: List[str], embeddings: np.ndarray) -> None:
    stamps = [_stamp(path) for path in paths]
    partial = cache + ".partial"
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(partial, "wb") as f:
            np.savez(f, paths=np.array([os.path.relpath(p, folder) for p in paths], dtype=str),
                     sizes=np.array([s for s, _ in stamps], np.int64),
                     mtimes=np.array([t for _, t in stamps], np.int64), embeddings=embeddings.astype(np.float32))
        os.replace(partial, cache)
    except OSError as error:
        _console.warn(f"cannot keep the folder's embeddings in {os.path.dirname(cache)} ({error}); the next search "
                      f"embeds the folder again.")
