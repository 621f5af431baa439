"""Reading a file, bounded: the one way every tool reads what it parses (JSON, JSON lines, YAML).

    read_text(path, what)    strict UTF-8 text of a regular file of at most MAX_BYTES
    parse_json(text, where)  json.loads after a nesting check (MAX_DEPTH), before the parser
                             recurses (Python's json raises RecursionError ~1,000 levels down)
    read_json(path, what)    both
    read_jsonl(path, what)   one JSON value per line; a last line cut off (no newline: a run
                             killed or still writing) is left out and said
    read_yaml(path, what)    YAML that refuses aliases (*name: the "billion laughs" expansion)
                             and nesting past MAX_DEPTH

A file that cannot be read this way is a RecordError (training.records: the project's user
error for a file, exit 2) whose one line names the file and what is wrong with it. The
limits are far above anything the project writes (a manifest is tens of kB, a metrics.jsonl
of a week-long run tens of MB) and far below what would take the machine down.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from training.cli import BadFile
from training.launch.settings import BadInput

MAX_BYTES = 512 * 1024 * 1024   # a file read whole (metrics.jsonl of a long run: tens of MB)
MAX_DEPTH = 100                 # nesting of JSON/YAML containers (ours: under 10)


class RecordError(BadFile, BadInput):
    """A file the project reads (its own, or one a user gives) that cannot be used: one line
    naming the file and the field, exit 2. training.cli.BadFile (a ValueError) and the
    launcher's BadInput (a LaunchError) at once, so every tool's handler prints it the same
    way."""

    exit_code = 2

    def __str__(self) -> str:
        """One line, whatever the file held: control characters (a newline in a key, ...)
        shown escaped."""
        return _CONTROL.sub(lambda m: repr(m.group())[1:-1], super().__str__())


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def _not_a(what: str) -> str:
    """'not a manifest', 'not an import record'."""
    return f"not {'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"


def read_bytes(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file PATH (never a folder, FIFO or device: reading one would
    hang or never end); RecordError when missing, unreadable or larger than MAX_BYTES."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file (give the {what})") from None
    except OSError as err:
        raise RecordError(f"{path}: cannot read the {what} ({err.strerror or err})") from None
    if stat.S_ISDIR(info.st_mode):
        raise RecordError(f"{path}: is a folder; give the {what} file")
    if not stat.S_ISREG(info.st_mode):
        raise RecordError(f"{path}: not a regular file (a pipe or device?); give the {what} file")
    if info.st_size > max_bytes:
        raise RecordError(f"{path}: {info.st_size:,} bytes, more than the {max_bytes:,} a {what} "
                          "may have; is it the right file?")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise RecordError(f"{path}: cannot read the {what} ({err.strerror or err})") from None
    if len(data) > max_bytes:
        raise RecordError(f"{path}: more than the {max_bytes:,} bytes a {what} may have; "
                          "is it the right file?")
    return data


def decode(data: bytes, where: str | Path, what: str) -> str:
    """DATA as strict UTF-8; RecordError naming the line and byte offset of the first bad
    byte (a file cut inside a character, or not text)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise RecordError(f"{where}:{line}: not UTF-8 text (byte {err.start}: "
                          f"{data[err.start:err.start + 1]!r}); {_not_a(what)}") from None


def read_text(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> str:
    return decode(read_bytes(path, what, max_bytes), path, what)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON TEXT nests its arrays and objects more than LIMIT deep (brackets inside
    strings not counted); linear in the text and without recursion, so it runs before the
    parser does."""
    if text.count("[") + text.count("{") <= limit:
        return False
    level = 0
    for match in _BRACKET.finditer(_STRING.sub("", text)):
        level += 1 if match.group() in "[{" else -1
        if level > limit:
            return True
    return False


def parse_json(text: str, where: str | Path, what: str) -> Any:
    """json.loads of TEXT; RecordError when it is not JSON, cut short, or nested deeper than
    MAX_DEPTH (checked first: the parser would recurse out of the stack)."""
    if too_deep(text):
        raise RecordError(f"{where}: {_not_a(what)}: JSON nested too deep (more than {MAX_DEPTH} "
                          "levels)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"{where}: {_not_a(what)}: invalid or cut-short JSON ({err})") from None
    except RecursionError:  # the check above keeps the parser far from the limit
        raise RecordError(f"{where}: {_not_a(what)}: JSON nested too deep to read") from None


def read_json(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON document at PATH (see read_bytes, decode, parse_json); an empty file is
    RecordError too."""
    text = read_text(path, what, max_bytes)
    if not text.strip():
        raise RecordError(f"{path}: empty, {_not_a(what)}")
    return parse_json(text, path, what)


def read_jsonl(path: str | Path, what: str, max_bytes: int = MAX_BYTES
               ) -> tuple[list[tuple[int, Any]], str | None]:
    """([(line number, value)], note) of a JSON-lines file. A last line without its newline
    that does not parse was cut off (a run killed, or still writing): it is left out and the
    note says so. Any other bad line is RecordError naming it."""
    text = read_text(path, what, max_bytes)
    lines = text.splitlines()
    values: list[tuple[int, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            values.append((number, parse_json(line, f"{path}:{number}", what)))
        except RecordError:
            if number == len(lines) and not text.endswith("\n"):
                return values, (f"{path}:{number}: the last line is cut off (a run killed or still "
                                f"running); using the {len(values)} complete lines")
            raise
    return values, None


def _yaml_loader():
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """yaml.SafeLoader without aliases (each *name can repeat a whole subtree: a few
        hundred bytes expand to gigabytes) and with a nesting limit."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"an alias (*{event.anchor}) is not accepted: write the value "
                    "out where it is used", event.start_mark)
            self._depth = getattr(self, "_depth", 0) + 1
            try:
                if self._depth > MAX_DEPTH:
                    raise yaml.composer.ComposerError(
                        None, None, f"nested too deep (more than {MAX_DEPTH} levels)",
                        self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return BoundedLoader


def parse_yaml(text: str, where: str | Path, what: str) -> Any:
    """yaml.safe_load of TEXT without aliases or deep nesting; RecordError naming the line."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecordError(f"{where}: {_not_a(what)}: not valid YAML{at} "
                          f"({getattr(err, 'problem', None) or err})") from None
    except RecursionError:
        raise RecordError(f"{where}: {_not_a(what)}: YAML nested too deep to read") from None


def read_yaml(path: str | Path, what: str, max_bytes: int = 16 * 1024 * 1024) -> Any:
    return parse_yaml(read_text(path, what, max_bytes), path, what)
