"""What every subcommand's flags share: the one-line usage error and the
integer types. At the bottom of the layering (it imports only keras_vit.errors),
so command modules in training/, export/ and inspection/ take it without
importing keras_vit.cli, which sits above them and dispatches to them."""

from __future__ import annotations

import argparse

from keras_vit.errors import UserError


class UsageError(UserError):
    """Bad command-line input: one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block): `keras-vit CMD: error: ...`."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive_int(text):
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text):
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def image_size(text):
    """--image-size: "224" (a square side) -> 224, or "160,288" (height,width) -> (160, 288)."""
    parts = text.replace("x", ",").split(",")
    if len(parts) == 1:
        return positive_int(text)
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected SIDE or HEIGHT,WIDTH, got {text!r}")
    return tuple(positive_int(part.strip()) for part in parts)


def _int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
