"""The `keras-vit` command line: one subcommand per job, each defined next to
the code it drives (a module with `add_arguments(parser)` and `run(args)`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> (module, one-line help). Modules are imported only when used,
# so `keras-vit predict` does not pay for the trainer's imports.
COMMANDS = {
    "train": ("keras_vit.training.cli", "train or fine-tune a ViT (tf.distribute)"),
    "export": ("keras_vit.export.cli", "export SavedModel / TFLite / ONNX, validated against Keras"),
    "predict": ("keras_vit.inspection.cli_predict", "top-k labels for image files"),
    "inspect": ("keras_vit.inspection.cli_inspect", "attention maps and the paper's figures"),
    "bench": ("keras_vit.cli_bench", "benchmark against keras-hub and PyTorch"),
    "demo": ("keras_vit.demo", "train on the bundled MNIST digits, then export"),
    "variants": ("keras_vit.cli_variants", "list the registered variants and their checkpoints"),
}


def main(argv=None):
    # TensorFlow's C++ start-up chatter (CUDA probes, oneDNN notices) hides the
    # output users came for; TF_CPP_MIN_LOG_LEVEL=0 brings it back.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(prog="keras-vit", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help()
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nkeras-vit: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    sub = argparse.ArgumentParser(prog=f"keras-vit {name}", description=COMMANDS[name][1])
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    return module.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
