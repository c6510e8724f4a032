"""PEP 562 lazy attributes for the package `__init__`s: `import keras_vit` (and
`keras-vit --help`) must not start Keras or TensorFlow; a name is imported from
its module the first time it is used."""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional


def lazy_exports(package: str, names: Dict[str, str], before: Optional[Callable[[], None]] = None):
    """(__getattr__, __dir__) for a package whose public `names` live in modules.

    Args:
        package: the package's `__name__`.
        names: public name -> module it comes from (the module itself when the
            name is the module's last component, e.g. "layers" -> "keras_vit.layers").
        before: called once before the first lazy import (e.g. a backend check).
    """
    done = []

    def __getattr__(name):
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None and not done:
            before()
            done.append(True)
        module = importlib.import_module(module_name)
        value = module if module_name.rsplit(".", 1)[-1] == name and not hasattr(module, name) else getattr(
            module, name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__():
        return sorted(set(names) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
