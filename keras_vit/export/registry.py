"""The export formats, collected from their modules: what `export()`, the
command line, the defaults and the validation read.

    REGISTRY["tflite-int8"].layout   # "{name}.int8.tflite"

A new format is a module declaring `EXPORT_FORMATS` (keras_vit.export.format),
named in MODULES; its place there is its place in the default order and the report.
"""

from __future__ import annotations

import importlib
from typing import Dict, Iterable, List, Union

from keras_vit.errors import UserError
from keras_vit.export.format import ExportFormat

MODULES = ("saved_model", "tflite", "tflite_int8", "onnx_model", "hf")


class ExportError(UserError):
    """The export cannot start: unknown format, missing model, unsuitable model or data."""


def _collect() -> Dict[str, ExportFormat]:
    formats: Dict[str, ExportFormat] = {}
    for module in MODULES:
        for fmt in importlib.import_module(f"keras_vit.export.{module}").EXPORT_FORMATS:
            if fmt.name in formats:
                raise RuntimeError(f"export format {fmt.name!r} is declared twice (keras_vit.export.{module})")
            formats[fmt.name] = fmt
    return formats


REGISTRY: Dict[str, ExportFormat] = _collect()
# Names, in order: the default formats (less those whose extra is missing) and those built only when named.
FORMATS = tuple(name for name, fmt in REGISTRY.items() if fmt.default)
OPTIONAL_FORMATS = tuple(name for name, fmt in REGISTRY.items() if not fmt.default)


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def parse_formats(formats: Union[str, Iterable[str]]) -> List[str]:
    """Format names from "a,b" or a list ("saved-model" and "tflite_int8" as
    well), in the order given, once each; ExportError for unknown ones."""
    by_key = {_key(name): name for name in REGISTRY}
    names = [f for f in (formats.split(",") if isinstance(formats, str) else formats) if f.strip()]
    unknown = [n.strip() for n in names if _key(n) not in by_key]
    if unknown or not names:
        raise ExportError(f"Unknown export format(s) {unknown or names}; choose from {', '.join(REGISTRY)}.")
    return list(dict.fromkeys(by_key[_key(n)] for n in names))


def get(name: str) -> ExportFormat:
    return REGISTRY[parse_formats([name])[0]]
