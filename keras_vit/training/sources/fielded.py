"""list:TRAIN.csv[,EVAL.csv] whose header names fields beyond the image and its label: one
example a row, each field a column (keras_vit.tasks.fields):

    image,mask                      # or path,label,mask / image,depth / image,text ...
    photos/0001.jpg,masks/0001.png

An image, mask or depth column holds a file path (relative to the list); a mask is a
one-channel image of class ids (PNG mode L, P or I), a depth map a one-channel PNG
(8 or 16 bit) of the same size as its image; a text column holds the text itself. Without
EVAL, every 10th row is held out. Without a label column, --num-classes gives the classes a
mask's ids run over.
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np
import tensorflow as tf

from keras_vit import images as images_lib
from keras_vit.errors import UserError
from keras_vit.tasks.fields import IGNORE
from keras_vit.training.sources.source import HELD_OUT_EVERY, DecodeProblems, table_source
from keras_vit.utils import storage

IMAGE_COLUMNS = ("path", "file", "filename", "image")
FILE_KINDS = ("mask", "depth")  # columns of file paths, read as one-channel maps


def is_fielded(path, kinds) -> bool:
    """Whether a CSV list's header names a field of the Task (`kinds`) other than its image and
    label: a list of (path, label) with any header is the classes' list (sources/files.py)."""
    wanted = [name for name in kinds if name not in ("image", "label")]
    if not wanted or path.lower().endswith(".json") or not storage.isfile(path):
        return False
    first = next(csv.reader(io.StringIO(_text(path))), [])
    names = [cell.strip().lower() for cell in first]
    return bool(names) and names[0] in IMAGE_COLUMNS and any(name in names[1:] for name in wanted)


def _text(path) -> str:
    """A list file's text, without the byte-order mark a spreadsheet's "CSV UTF-8" writes first."""
    return storage.read_text(path).lstrip("\ufeff")


def _table(path):
    """(column names, rows as lists of cells) of a CSV list with a header; paths made absolute."""
    reader = csv.reader(io.StringIO(_text(path)))
    header = [cell.strip().lower() for cell in next(reader)]
    rows = [[cell.strip() for cell in row] for row in reader if row and any(cell.strip() for cell in row)]
    for number, row in enumerate(rows, 2):
        if len(row) != len(header):
            raise UserError(f"list:{path}: line {number} has {len(row)} cells and the header {len(header)} "
                            f"({','.join(header)}): give every row a value for each column.")
    return header, rows


def fielded_list_source(config, spec, kinds):
    """The Source of list:TRAIN[,EVAL] with field columns; `kinds`: {field: FieldKind} of the Task
    (its fields the list does not have are left for the plan to name)."""
    name, problems = f"list:{spec}", DecodeProblems()
    files = spec.split(",")
    if len(files) > 2:
        raise UserError(f"{name}: give list:TRAIN or list:TRAIN,EVAL.")
    tables = [_table(f) for f in files]
    header = tables[0][0]
    if any(table[0] != header for table in tables[1:]):
        raise UserError(f"{name}: the two lists have different columns: give both the same header.")
    columns = {"image": 0, **{n: i for i, n in enumerate(header) if i and n in kinds and n != "image"}}
    if "label" in header:
        columns["label"] = header.index("label")
    bases = [storage.dirname(storage.abspath(f)) for f in files]
    classes, numbered = _classes(tables, columns.get("label"))
    splits = [_columns(rows, columns, base, kinds, classes) for (_, rows), base in zip(tables, bases)]
    if len(splits) == 1:
        held = np.arange(len(splits[0]["image"])) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        splits = [{k: v[~held] for k, v in splits[0].items()}, {k: v[held] for k, v in splits[0].items()}]
    num_classes = _num_classes(config, name, splits, columns, classes)
    order = list(columns)
    return table_source(
        {split: tuple(table[c] for c in order) for split, table in zip(("train", "eval"), splits)},
        name=name, num_classes=num_classes, num_channels=3, image_size=None, train_split="train",
        eval_split="eval", decode=_decoder(order, kinds, name, config.strict_data, problems, num_classes),
        problems=problems,
        fields=tuple(order), class_names=None if numbered else classes)


def _classes(tables, label_column):
    """(class names in label order, whether they are numbers): integer labels keep their values,
    names are sorted; (None, True) without a label column."""
    from keras_vit.training.sources.files import _list_classes

    if label_column is None:
        return None, True
    return _list_classes([row[label_column] for _, rows in tables for row in rows])


def _columns(rows, columns, base, kinds, classes):
    def located(p):
        return p if storage.is_remote(p) or os.path.isabs(p) else storage.join(base, p)

    out = {}
    for field, index in columns.items():
        cells = [row[index] for row in rows]
        if field == "label":
            out[field] = np.array([classes.index(str(int(c)) if c.lstrip("-").isdigit() else c) for c in cells],
                                  np.int32)
        elif field == "image" or kinds[field].name in FILE_KINDS:
            out[field] = np.array([os.fsencode(located(c)) for c in cells], dtype=bytes)
        else:
            out[field] = np.array([c.encode("utf-8") for c in cells], dtype=bytes)
    return out


def _num_classes(config, name, splits, columns, classes):
    if "label" in columns:
        return int(config.num_classes or len(classes))
    if not config.num_classes:
        raise UserError(f"{name} has no label column, so the classes are not known: give --num-classes N "
                        f"(num_classes=N; for masks, the class ids run 0..N-1).")
    return int(config.num_classes)


NPY_MAGIC = b"\x93NUMPY"  # how every .npy file begins


def map_from_bytes(content: bytes) -> np.ndarray:
    """A mask or depth file's bytes -> (H, W) float32: the stored values (class ids, depths). A
    one-channel image (PNG mode L, P, I or I;16: a palette mask's indices, a 16-bit depth map) or
    a .npy array (H, W), told by its magic bytes (never unpickled)."""
    from PIL import Image

    if content[:len(NPY_MAGIC)] == NPY_MAGIC:
        value = np.load(io.BytesIO(content), allow_pickle=False)
        value = value[..., 0] if value.ndim == 3 and value.shape[-1] == 1 else value
        if value.ndim != 2:
            raise ValueError(f"a mask or depth map is (H, W); this array is {value.shape}")
        return value.astype(np.float32)
    with Image.open(io.BytesIO(content)) as image:
        if image.mode not in ("L", "P", "I", "I;16", "I;16B", "F"):
            raise ValueError(f"a mask or depth map is one channel of values (PNG mode L, P or I); this is {image.mode}")
        return np.asarray(image, dtype=np.float32) if image.mode != "P" else np.asarray(image).astype(np.float32)


def check_classes(mask: np.ndarray, num_classes: int, path: str) -> None:
    """A mask's values are class ids 0..num_classes-1, or IGNORE where no class is annotated."""
    values = np.unique(mask)
    wrong = values[(values != IGNORE) & ((values < 0) | (values >= num_classes) | (values != np.round(values)))]
    if wrong.size:
        raise ValueError(f"{path} holds class {wrong.max():g}, and the run has {num_classes} classes "
                         f"(0..{num_classes - 1}; {IGNORE} marks pixels of no class): give --num-classes "
                         f"{int(wrong.max()) + 1}, or relabel it")


def _path(value) -> str:
    return os.fsdecode(value.item() if isinstance(value, np.ndarray) else value)


def _bytes(value) -> bytes:
    return bytes(value.item() if isinstance(value, np.ndarray) else value)


def _digest(value) -> str:
    import hashlib

    return hashlib.sha1(_bytes(value)).hexdigest()[:10]


def _decoder(order, kinds, name, strict, problems, num_classes, depth_png_scale=1.0, encoded=False):
    """(row of the columns in `order`) -> ({field: value}, ok): the image by keras_vit.images, each
    mask or depth file by map_from_bytes (the same size as its image; a mask's values class ids below
    `num_classes` or IGNORE; a depth map with a known pixel, an image's values times
    `depth_png_scale`: 0.001 for a PNG of millimetres), text and labels as they are. `encoded`:
    the image and maps are the files' bytes (a record's), not their paths."""
    maps = [i for i, f in enumerate(order) if f not in ("image", "label") and kinds[f].name in FILE_KINDS]
    masks = [kinds[order[i]].name == "mask" for i in maps]
    depths = [kinds[order[i]].name == "depth" for i in maps]

    def read(image_value, *map_columns):
        # bytes in tf.data's graph; 0-d arrays where decode runs eagerly
        if encoded:  # a record has no name: its image's digest tells it apart, epoch after epoch
            image_path = f"the record of {name} whose image's SHA-1 begins {_digest(image_value)}"
            contents = [_bytes(v) for v in map_columns]
            map_paths = [f"the {order[i]} of {image_path}" for i in maps]
        else:
            image_path, map_paths = _path(image_value), [_path(p) for p in map_columns]
        try:
            image = images_lib.decode(_bytes(image_value) if encoded else image_path, 3)
            if not encoded:
                contents = [storage.read_bytes(p) for p in map_paths]
            for path, content, is_depth in zip(map_paths, contents, depths):
                if not content:  # a record without the feature
                    raise ValueError(f"{path} is empty: give each record its {'depth' if is_depth else 'mask'} "
                                     f"as an encoded file (docs/dense-prediction.md, \"Data\")")
            values = [map_from_bytes(c) for c in contents]
            for i, (content, is_depth) in enumerate(zip(contents, depths)):
                if is_depth and content[:len(NPY_MAGIC)] != NPY_MAGIC:  # an image's values: millimetres
                    values[i] = values[i] * np.float32(depth_png_scale)
            for path, value, is_mask, is_depth in zip(map_paths, values, masks, depths):
                if is_mask:
                    check_classes(value, num_classes, path)
                if is_depth and not (value > 0).any():
                    raise ValueError(f"{path} has no pixel of known depth (every value is 0, which marks an "
                                     f"unknown one): leave the pair out, or give its depths")
                if value.shape != image.shape[:2]:
                    raise ValueError(f"{path} is {value.shape[1]}x{value.shape[0]} px and its image "
                                     f"{image.shape[1]}x{image.shape[0]} (read upright, by its EXIF orientation: "
                                     f"a mask is the upright image's size, as stored)")
            return (image, True, *values)
        except Exception as error:  # noqa: BLE001 - any file of the row that fails makes the example unreadable
            problems.report(image_path, str(error), strict)
            return (np.zeros((8, 8, 3), np.uint8), False, *[np.zeros((8, 8), np.float32) for _ in map_paths])

    @tf.autograph.experimental.do_not_convert
    def decode(raw):
        out = tf.numpy_function(read, [raw[0]] + [raw[i] for i in maps],
                                [tf.uint8, tf.bool] + [tf.float32] * len(maps), stateful=False)
        image, ok, values = out[0], out[1], out[2:]
        image.set_shape([None, None, 3])
        ok.set_shape([])
        example = {"image": image}
        for i, field in enumerate(order[1:], 1):
            example[field] = tf.cast(raw[i], tf.int32) if field == "label" else raw[i]
        for i, value in zip(maps, values):
            value.set_shape([None, None])
            example[order[i]] = value
        return example, ok

    return decode
