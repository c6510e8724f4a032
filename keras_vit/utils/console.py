"""What keras_vit prints, and what it keeps TensorFlow and its converters from printing.

* `import_tensorflow_quietly()`: for the `keras-vit` command only, which owns
  its process: TensorFlow imported with TF_CPP_MIN_LOG_LEVEL defaulting to 3
  and the start-up lines it writes from C++ before any log level applies
  (`I0000 ... oneDNN`, `Could not find cuda drivers`, `WARNING: All log
  messages before absl::InitializeLog()`) taken out of stderr. Level 3 also
  hides `E0000 ... failed call to cuInit`, logged when a machine without a GPU
  starts its devices. A TF_CPP_MIN_LOG_LEVEL set by the user is kept; with 0
  (`keras-vit --verbose`) nothing is filtered. `import keras_vit` in a user's
  program does none of this: TensorFlow logs there as it would without us.
* `quiet_conversion()`: around a TFLite or ONNX conversion, the converters'
  chatter (`fully_quantize: 0, inference_type: 6 ...`, `tf.lite.Interpreter is
  deprecated`, XNNPACK's `INFO: Created TensorFlow Lite XNNPACK delegate`,
  tf2onnx's `Issue encountered when serializing table_initializer`, the int8
  quantisation debugger's `Mean of empty slice`) is dropped;
  anything else they print is passed on.
* `warn(message)`: `keras-vit: warning: ...`, one line on stderr.
* `argument(name, value)`: how a message names an argument: `--weights PATH`
  on the command line, `weights='PATH'` in Python (`keras_vit.cli` sets
  COMMAND_LINE); `argument(name)` a switch (`--remat` / `remat=True`);
  `either(flags, keywords)` where the two differ by more than spelling.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import sys
import tempfile
import warnings

# True while `keras-vit` (keras_vit.cli.main) runs: messages name flags, not keyword arguments.
COMMAND_LINE = False

# What TensorFlow (and XLA) write from C++ while loading, before any log level applies.
STARTUP_CHATTER = re.compile(
    r"absl::InitializeLog|cudart_stub|cuda_|cuInit|cuDNN|cuFFT|cuBLAS|TensorRT|oneDNN|onednn|cpu_feature_guard|"
    r"This TensorFlow binary is optimized|rebuild TensorFlow with the appropriate compiler flags|"
    r"computation placer|Unable to register|GPU will not be used|^\s*$")

# What the TFLite converter, its quantisation debugger, the LiteRT interpreter
# and tf2onnx print while an export converts (on fd 2, past Python's reach).
CONVERSION_CHATTER = re.compile(
    r"^fully_quantize: \d|^INFO: Created TensorFlow Lite XNNPACK delegate|tf\.lite\.Interpreter is deprecated|"
    r"^\s*$")
_PYTHON_WARNINGS = r"[\s\S]*tf\.lite\.Interpreter is deprecated"
_DEBUGGER_MODULE = r"tensorflow\.lite\.tools\.optimize\.debugging"
_TF_LOG_RECORDS = ("Issue encountered when serializing",)

_DEFAULT_LOG_LEVEL = "3"


def verbose() -> bool:
    """True when the user asked for TensorFlow's logs (TF_CPP_MIN_LOG_LEVEL=0, `keras-vit --verbose`)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"


def warn(message: str) -> None:
    """A warning as one line on stderr (the work goes on), as every keras-vit warning."""
    print(f"keras-vit: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)


_SWITCH = object()


def argument(name: str, value=_SWITCH) -> str:
    """An argument as the user gives it: `--name VALUE` on the command line
    (a tuple comma-separated), name='VALUE' in Python; without a value, a
    switch: `--name` / name=True."""
    if value is _SWITCH:
        return f"--{name.replace('_', '-')}" if COMMAND_LINE else f"{name}=True"
    if COMMAND_LINE:
        flag = "--" + name.replace("_", "-")
        if isinstance(value, str):
            return f"{flag} {shlex.quote(value)}"  # as it would be typed
        if isinstance(value, (tuple, list)):  # flags take lists comma-separated (--image-size 224,320)
            return f"{flag} {','.join(map(str, value))}"
        return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
    return f"{name}={value!r}"


def either(command_line: str, python: str) -> str:
    """The words for the caller where a flag and its keyword differ by more than spelling."""
    return command_line if COMMAND_LINE else python


# --- fd 2 -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def filtered_stderr(chatter):
    """Runs the block with file descriptor 2 (what C++ writes to, as well as
    sys.stderr) captured; afterwards passes on every line `chatter` does not
    match. Does nothing when fd 2 cannot be duplicated or the user is verbose."""
    if verbose():
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as captured:
        _flush()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines()
                    if not chatter.search(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


# --- importing TensorFlow ---------------------------------------------------------------------------

def import_tensorflow_quietly() -> None:
    """Imports TensorFlow now (if installed and not yet imported), without its
    start-up chatter. The command line's alone: it sets the process's log level."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", _DEFAULT_LOG_LEVEL)
    with filtered_stderr(STARTUP_CHATTER):
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            pass  # whatever needs it says so


# --- converters -------------------------------------------------------------------------------------

class _DropRecords(logging.Filter):
    def filter(self, record):
        message = record.getMessage()
        return not any(text in message for text in _TF_LOG_RECORDS)


@contextlib.contextmanager
def quiet_conversion():
    """Runs a TFLite / ONNX conversion without the converters' chatter (see the module docstring)."""
    if verbose():
        yield
        return
    logger = logging.getLogger("tensorflow")
    drop = _DropRecords()
    logger.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_PYTHON_WARNINGS)
            # The quantisation debugger averages statistics of tensors it saw no values of.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=_DEBUGGER_MODULE)
            with filtered_stderr(CONVERSION_CHATTER):
                yield
    finally:
        logger.removeFilter(drop)
