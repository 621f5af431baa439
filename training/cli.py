"""What every command line of the project shares: bad input is one line on stderr, exit 2.

`ArgumentParser` is argparse's, except that an argument error is one line that says what to
do, instead of the usage block followed by the error:

    python -m training.metrics flops: error: argument --seq-length: must be a whole number >= 1,
    not '0' (python -m training.metrics flops --help lists the arguments)

The argparse types below refuse what argparse's `int`/`float` let through (0, negative
counts, nan, inf) with the same kind of line. Every `python -m training.<x>` tool uses them;
tests/test_bad_input_catalogue.py runs each tool on bad input and counts tracebacks.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the arguments)\n")


def _number(text: str, kind, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
    return value


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, not {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a positive number")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
    return value


def finite_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


def fail(message: str, code: int = 2) -> int:
    """Print `error: message` (secrets masked) on stderr; return the exit status (for
    `return fail(...)`)."""
    from training.credentials import mask_text

    print(f"error: {mask_text(message)}", file=sys.stderr)
    return code


class BadFile(ValueError):
    """A file named on the command line cannot be used; the message is the one line to print."""


def write_text(path: str | Path, text: str, what: str) -> None:
    """Write an output file (never through a link, nor into a FIFO or device:
    training.safe_files); BadFile (one line, what to do) when it cannot be written."""
    from training import safe_files

    try:
        safe_files.write_text(path, text, what)
    except OSError as err:
        raise BadFile(f"{path}: cannot write the {what} ({err.strerror or err}); "
                      "check that its folder exists and is writable") from None
