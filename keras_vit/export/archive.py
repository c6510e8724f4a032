"""Every SavedModel keras-vit writes (TF Serving's, the TFLite converter's source, the
feature maps'), each weight stored once.

Keras 3.15's ExportArchive (keras.export.ExportArchive, model.export) stores every
weight twice on TensorFlow (keras-team/keras#23553): `track(model)` lists the model's
Keras Variables under `variables`, and `write_out` lists the tf.Variables its
endpoints read under `_all_variables`. A Keras Variable is a trackable of its own
that wraps a tf.Variable, and the checkpoint tells objects apart by identity, so it
writes the wrapper and the wrapped variable as two tensors of the same values:
twice the bytes on disk, and twice the memory in TF Serving, which restores both.

So no archive of Keras' is used here: the root is a tf.Module that lists the
tf.Variables the traced signatures read, each once, and tf.saved_model.save writes
it. That holds whatever a later Keras does about the bug, and it changes nothing in
Keras. The loaded object keeps what Keras' archive gives it: `variables`,
`trainable_variables`, `non_trainable_variables` and one function per endpoint.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, Sequence, Tuple

import tensorflow as tf

Endpoint = Tuple[Callable, Sequence[tf.TensorSpec]]  # (fn, input_signature)


class _Root(tf.Module):
    # tf.Module computes these three by walking its attributes, and a property is not
    # saved; as plain attributes they are lists the SavedModel stores, so a loaded model
    # has them, as one written by Keras' archive does.
    variables = trainable_variables = non_trainable_variables = ()


def write(path, endpoints: Dict[str, Endpoint], resources: Iterable = ()):
    """Writes the SavedModel directory `path`.

    Args:
        endpoints: {name: (fn, input_signature)}, each a signature and a function of
            the loaded object; the first is also serving_default when none is named so.
        resources: trackables the functions use besides variables (a lookup table and,
            through its initializer, its asset file).
    """
    functions = {name: tf.function(fn, input_signature=list(spec), autograph=False)
                 for name, (fn, spec) in endpoints.items()}
    signatures = {name: function.get_concrete_function() for name, function in functions.items()}
    signatures.setdefault("serving_default", next(iter(signatures.values())))  # TF Serving's default
    root = _Root()
    weights = read_variables(signatures.values())
    root.variables = weights
    root.trainable_variables = [v for v in weights if v.trainable]
    root.non_trainable_variables = [v for v in weights if not v.trainable]
    root.resources = list(resources)
    for name, function in functions.items():
        setattr(root, name, function)
    tf.saved_model.save(root, os.fspath(path), signatures=signatures)


def read_variables(concrete_functions) -> list:
    """The tf.Variables the traced functions read, each once. The graph captures the
    tf.Variable itself (a Keras Variable converts to its tf.Variable's value), so
    listing these, not the model's Keras Variables, is both complete (whatever the
    endpoints read, from any model) and free of wrappers."""
    found = {}
    for function in concrete_functions:
        for variable in function.variables:
            found.setdefault(id(variable), variable)
    return list(found.values())
