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
import json
import math
import sys
from pathlib import Path
from typing import Any


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


def read_json(path: str | Path, what: str) -> Any:
    """The JSON document at `path`, or BadFile saying why not (missing, a folder, unreadable,
    empty, cut short, not JSON) and naming `what` was expected."""
    from training.safe_files import read_text

    path = Path(path)
    if path.is_dir():
        raise BadFile(f"{path}: is a folder; give the {what} file")
    try:
        text = read_text(path, what)   # a FIFO or device is refused, not waited on
    except FileNotFoundError:
        raise BadFile(f"{path}: no such file (give the {what})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadFile(f"{path}: cannot read the {what} ({getattr(err, 'strerror', None) or err})") from None
    if not text.strip():
        raise BadFile(f"{path}: empty, not a {what}")
    return loads(text, path, what)


def loads(text: str, path: str | Path, what: str) -> Any:
    """json.loads with BadFile for text that is not JSON, cut short, or nested too deep."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadFile(f"{path}: not a {what}: invalid or cut-short JSON ({err})") from None
    except RecursionError:
        raise BadFile(f"{path}: not a {what}: JSON nested too deep to read") from None


def write_text(path: str | Path, text: str, what: str) -> None:
    """Write an output file (never through a link, nor into a FIFO or device:
    training.safe_files); BadFile (one line, what to do) when it cannot be written."""
    from training import safe_files

    try:
        safe_files.write_text(path, text, what)
    except OSError as err:
        raise BadFile(f"{path}: cannot write the {what} ({err.strerror or err}); "
                      "check that its folder exists and is writable") from None
