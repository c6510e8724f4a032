"""Is the unrelated `keras-vit` distribution installed next to us?

The package index's `keras-vit` (a Keras 2 era project) also installs a
top-level `keras_vit` package, so installing both makes them overwrite each
other's files: `import keras_vit` may then run a mix of the two. This module
finds that state cheaply (distribution metadata only, no import of either
package) so the command line can say so in one line.
"""

from __future__ import annotations

from importlib import metadata
from typing import Optional

from keras_vit.errors import DISTRIBUTION

OTHER = "keras-vit"


def _normalise(name: str) -> str:
    # PEP 503: keras_vit, Keras-ViT and keras.vit all name the same distribution.
    return name.lower().replace("_", "-").replace(".", "-")


def _installed_files(dist):
    """The paths an installer recorded (RECORD of a wheel install, or
    installed-files.txt of a legacy egg install). Not SOURCES.txt: an
    *.egg-info left in a source checkout lists sources, not installed files."""
    record = dist.read_text("RECORD")
    if record is not None:
        return [line.split(",")[0] for line in record.splitlines()]
    legacy = dist.read_text("installed-files.txt")
    return legacy.splitlines() if legacy is not None else []


def _owns_package_files(dist) -> bool:
    """Whether an installer put a keras_vit/__init__.py of this distribution's
    own on disk (an editable install records only a finder, not the file)."""
    return any(path.replace("\\", "/").endswith("keras_vit/__init__.py") for path in _installed_files(dist))


def conflicting_distribution(distributions=None) -> Optional[str]:
    """A one-line warning if another distribution named `keras-vit` has put its
    own keras_vit/__init__.py into this environment; None otherwise.

    `distributions` (for tests) replaces the installed distributions."""
    if distributions is None:
        # Only the metadata directories named like keras-vit are read: cheap at start-up.
        distributions = metadata.distributions(name=OTHER)
    for dist in distributions:
        if _normalise(dist.metadata["Name"] or "") == OTHER and _owns_package_files(dist):
            return (f"The unrelated package {OTHER} {dist.version} is installed in this environment and shares "
                    f"the import name keras_vit with {DISTRIBUTION}: they overwrite each other's files. "
                    f"Fix: pip uninstall -y {OTHER} {DISTRIBUTION} && pip install {DISTRIBUTION}")
    return None
