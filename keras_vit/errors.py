"""The kinds of failure keras_vit tells apart, at the bottom of the layering
(imports nothing of keras_vit, Keras or TensorFlow).

- `UserError`: the input is wrong (a value, name, path, file or data) and the
  message names the fix. The command line prints it as one line, exit 2.
- `MissingExtra`: an optional dependency is not installed; the message names
  the extra to install. One line, exit 2.
- `CannotContinue`: the work stopped for a known reason outside our code
  (out of memory, a non-finite loss, an export that failed its check, a
  signal). One line, exit 1.

Anything else is a bug of ours: the command line prints the traceback and
asks for a report.
"""

from __future__ import annotations

import importlib

DISTRIBUTION = "keras-vision-transformer"
"""The name keras_vit is installed under (`pip install keras-vision-transformer`).
The package index's `keras-vit` is an unrelated project."""

class UserError(ValueError):
    """Bad input: a value, name, path, file or data that cannot be used as given.

    A `ValueError`, so callers that caught `ValueError` before still do."""


class MissingExtra(UserError, ImportError):
    """An optional dependency is missing; the message names the extra."""


class CannotContinue(RuntimeError):
    """Work stopped for a known reason that is not a bug (the message says why and what to do)."""


def install_hint(extra: str) -> str:
    """`pip install "keras-vision-transformer[EXTRA]"`, the one spelling of every hint."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'


def require(module: str, extra: str, needed_for: str):
    """Imports `module`, or raises `MissingExtra` naming the extra that brings it.

    `needed_for` completes "... needs MODULE": e.g. "TFLite export"."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name and not (module == error.name or module.startswith(error.name + ".")):
            raise  # the module is there but something it imports is broken: not a missing extra
        raise MissingExtra(f"{needed_for} needs {module.split('.')[0]}, which is not installed: "
                           f"{install_hint(extra)}") from None
