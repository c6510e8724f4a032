"""Registers keras_vit's layers with Keras whenever Keras gets imported.

`import keras_vit` no longer imports Keras (the command line must start
without it), yet a `.keras` file holding a ViT must load after a plain
`import keras_vit`. Keras 3 looks custom classes up in its registry only: it
imports the module recorded in a `.keras` config solely for its own packages
(keras, keras_hub, keras_cv, keras_nlp), so keras_vit.model has to be
imported before the file is read. When Keras is already loaded that happens
now; otherwise an import hook runs it right after Keras finishes loading.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def _register():
    import keras_vit.model  # noqa: F401 - its import registers ViT and its layers


class _AfterKerasImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of "keras" so that
    keras_vit.model is imported once Keras has finished loading."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec


def register_layers_with_keras():
    if "keras" in sys.modules:
        if getattr(sys.modules["keras"], "saving", None) is not None:
            _register()
        return  # keras is loading right now: its hook (if any) registers at the end
    if not any(isinstance(f, _AfterKerasImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasImport())
