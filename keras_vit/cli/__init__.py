"""The `keras-vit` command line: one subcommand per job, each defined next to
the code it drives (a module with `add_arguments(parser)` and `run(args)`).

Known failures are one line, `keras-vit CMD: error: ...`, naming the problem
and the fix: exit status 2 for bad input (`keras_vit.errors.UserError`: flags,
names, paths, data; a missing optional dependency), 1 for a stop that is not
a bug (`CannotContinue`: out of memory, a failed export check; `OSError`: the
disk, permissions, a missing file), 130 for Ctrl-C. Anything else is a bug of
ours: its traceback is printed with a line asking for a report, exit 1.
`--debug` adds the traceback to the one-line kinds too; `--verbose` lets
TensorFlow's start-up messages through.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback

from keras_vit.utils import console as _console, install_check as _install_check
from keras_vit.utils.flags import Parser, UsageError, non_negative_int, positive_int  # noqa: F401 - re-exported
from keras_vit.errors import CannotContinue, UserError

# subcommand -> (module, one-line help). Modules are imported only when used,
# and define their flags without importing Keras or TensorFlow, so that every
# `--help` answers at once.
COMMANDS = {
    "train": ("keras_vit.training.cli", "train or fine-tune a ViT (tf.distribute)"),
    "export": ("keras_vit.export.cli", "export SavedModel / TFLite / ONNX, validated against Keras"),
    "quantize": ("keras_vit.cli.quantize", "int8 / int4 weights for a smaller model to serve"),
    "predict": ("keras_vit.inspection.cli_predict", "top-k labels for image files"),
    "zero-shot": ("keras_vit.cli.zero_shot", "classify images into labels written at run time (SigLIP, CLIP)"),
    "search": ("keras_vit.cli.search", "rank a folder's images for a sentence (SigLIP, CLIP)"),
    "evaluate": ("keras_vit.cli.evaluate", "a classifier's accuracy on labelled images"),
    "inspect": ("keras_vit.inspection.cli_inspect", "attention maps and the paper's figures"),
    "bench": ("keras_vit.cli.bench", "benchmark against keras-hub and PyTorch"),
    "demo": ("keras_vit.cli.demo", "train on the bundled MNIST digits, then export"),
    "scenes": ("keras_vit.cli.scenes", "write synthetic scenes with masks and depth maps, to train on"),
    "variants": ("keras_vit.cli.variants", "list the registered variants and their checkpoints"),
}


# Re-exported: subcommand modules import them from keras_vit.utils.flags (below them
# in the layering); older code imported them from here.
_Parser = Parser


# What `keras-vit --help` says first: whole sentences, for a user.
DESCRIPTION = ("The Vision Transformer for Keras 3: train or fine-tune, export (SavedModel, TFLite, ONNX), "
               "predict and look inside, one subcommand each.")


def main(argv=None):
    # Messages name flags (--weights PATH) rather than keyword arguments while a command runs.
    previous, _console.COMMAND_LINE = _console.COMMAND_LINE, True
    try:
        return _main(argv)
    finally:
        _console.COMMAND_LINE = previous


def _main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = _take_flag(argv, "--debug")
    verbose = _take_flag(argv, "--verbose")
    # TensorFlow's C++ logging (CUDA probes, oneDNN notices) hides the output
    # users came for; --verbose (or TF_CPP_MIN_LOG_LEVEL) brings it back.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
    parser = Parser(prog="keras-vit", description=DESCRIPTION,
                     epilog="Global flags (any position): --debug (tracebacks), --verbose (TensorFlow's logs). "
                           "keras-vit --version prints the version.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] == "--version":
        import keras_vit  # its version only: the command line's import of it loads no Keras

        print(f"keras-vit {keras_vit.__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"keras-vit: error: unknown command {name!r}; choose from {', '.join(COMMANDS)} "
              f"(see keras-vit --help)", file=sys.stderr)
        return 2
    conflict = _install_check.conflicting_distribution()
    if conflict:  # a mix of two packages' files would fail in ways no message here could explain
        _console.warn(conflict)
    try:
        module = importlib.import_module(COMMANDS[name][0])
        sub = Parser(prog=f"keras-vit {name}", description=COMMANDS[name][1],
                      epilog="Global flags: --debug (tracebacks), --verbose (TensorFlow's logs).")
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        if not verbose and getattr(module, "NEEDS_TENSORFLOW", True):
            _import_tensorflow_quietly()
        return module.run(args) or 0
    except KeyboardInterrupt:
        print(f"keras-vit {name}: interrupted (Ctrl-C).", file=sys.stderr)
        return 130
    except _KNOWN as error:  # the input, or the world outside our code: one line
        if debug:
            traceback.print_exc()
        print(f"keras-vit {name}: error: {describe(error)}", file=sys.stderr)
        return 2 if isinstance(error, UserError) else 1
    except Exception as error:  # noqa: BLE001 - anything else is a bug of ours: show it whole
        traceback.print_exc()
        print(f"keras-vit {name}: internal error: {type(error).__name__}: {describe(error).rstrip('.')}. This is a bug in "
              f"keras_vit: please report it with the traceback above.", file=sys.stderr)
        return 1


# Failures that are not bugs: bad input (exit 2), and stops outside our code (exit 1).
_KNOWN = (UserError, CannotContinue, OSError)


def describe(error) -> str:
    """An exception's message as one line (lists folded into "; ")."""
    text = str(error) or type(error).__name__
    text = re.sub(r":\s*\n\s*-\s*", ": ", text)
    text = re.sub(r"\s*\n\s*-\s*", "; ", text)
    return " ".join(text.split())


def _take_flag(argv, flag):
    """Removes a global flag from anywhere in argv (before `--`)."""
    end = argv.index("--") if "--" in argv else len(argv)
    found = flag in argv[:end]
    if found:
        argv[:] = [a for i, a in enumerate(argv) if not (i < end and a == flag)]
    return found


def _import_tensorflow_quietly():
    """Imports TensorFlow with stderr (fd 2) captured, then passes on what is
    not start-up chatter: some of it is printed before any log level applies."""
    _console.import_tensorflow_quietly()


if __name__ == "__main__":
    sys.exit(main())
