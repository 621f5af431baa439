"""Errors of the data tools, each with the exit code its command-line front end uses.

`InputError` (exit 2): what the user gave cannot be used (a missing file, a glob that
matches nothing, a tokenizer without an end-of-document token, an output that exists).
Nothing has been written when it is raised.

`RunError` (exit 1): the run started and could not finish (a compressed file that is
truncated half-way, a disk that is full). Temporary outputs are removed.

Both carry a message meant to be printed as is, without a traceback.
"""

from __future__ import annotations


class DataError(Exception):
    exit_code = 1


class InputError(DataError):
    exit_code = 2


class RunError(DataError):
    exit_code = 1
