"""Files opened as the project means them: a write never goes through a link or into a FIFO or
device, a read never blocks on one, and a file taken from a source folder stays inside it.

    write_text(path, text, what)     a regular file at `path` (created or replaced in place)
    write_atomic(path, text, what)   the same through a temporary sibling renamed over it
    open_write(path, what, append)   the file object both use (text mode)
    read_text(path, what)            a regular file's text (a FIFO is refused, not waited on)
    source_file(path, root, what)    `path` if it is a regular file whose real path lies in root

Every refusal is UnsafeFile, the project's user error for a file (training.cli.BadFile): one
line naming the path and what to do, exit 2. A link where a file is to be written is refused
rather than replaced: it was put there by someone, and the user decides what it should be.
Standard library only (the launcher's side of the seam uses it).
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO

from training.cli import BadFile

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class UnsafeFile(BadFile, OSError):
    """A path that is not a plain file where one is expected (a link, a FIFO, a device, a
    folder), or a file outside the folder it is to come from. Also an OSError (as
    io.UnsupportedOperation is both): a writer that reports a file it cannot write reports
    this one the same way."""


def kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_write_target(path: str | Path, what: str) -> None:
    """UnsafeFile unless `path` is missing or a regular file (a link is not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise UnsafeFile(f"{path}: cannot check the {what} ({err.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFile(f"{path} is a symbolic link (to {os.readlink(path)}): the {what} is not "
                         "written through a link; remove the link, or write elsewhere")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{path} is {kind(st.st_mode)}, not a file: the {what} is not written "
                         "there; remove it, or write elsewhere")


def _open(path: str | Path, flags: int, what: str, writing: bool) -> int:
    """os.open with no-follow and non-blocking semantics, then a regular file or UnsafeFile."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW * writing | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            check_write_target(path, what)   # a link that appeared since: say so
        if err.errno == errno.ENXIO:    # opened for writing: a FIFO with no reader
            raise UnsafeFile(f"{path} is a FIFO (named pipe), not a file: the {what} is not "
                             "written there; remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        verb = "written" if writing else "read"
        raise UnsafeFile(f"{path} is {kind(st.st_mode)}, not a file: the {what} is not {verb} "
                         "there; remove it, or give a file")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def open_write(path: str | Path, what: str, append: bool = False, binary: bool = False) -> IO:
    """The file at `path` opened for writing (truncated, or appended to), never through a link
    and never a FIFO or device."""
    check_write_target(path, what)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = _open(path, flags, what, writing=True)
    mode = ("a" if append else "w") + ("b" if binary else "")
    return os.fdopen(fd, mode) if binary else os.fdopen(fd, mode, encoding="utf-8")


def write_text(path: str | Path, text: str, what: str) -> None:
    with open_write(path, what) as handle:
        handle.write(text)


def write_atomic(path: str | Path, text: str, what: str) -> None:
    """`text` into a new sibling (exclusive, no-follow), renamed over `path`: a reader sees the
    old file or the new one. A link or special file at `path` is refused, not replaced."""
    path = Path(path)
    check_write_target(path, what)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def read_bytes(path: str | Path, what: str) -> bytes:
    """A regular file's bytes (links followed: the caller decides where a file may come from);
    a FIFO, device or folder is UnsafeFile at once, never waited on."""
    fd = _open(path, os.O_RDONLY, what, writing=False)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def read_text(path: str | Path, what: str) -> str:
    return read_bytes(path, what).decode("utf-8")


def inside(path: str | Path, root: str | Path) -> bool:
    """The real path of `path` (every link followed) is `root`'s or below it."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def source_file(path: str | Path, root: str | Path, what: str) -> Path:
    """`path` when it is a regular file whose real path lies inside `root` (a link within the
    folder is fine); UnsafeFile for a link that leads out of it or a special file."""
    path = Path(path)
    if not inside(path, root):
        target = os.path.realpath(path)
        raise UnsafeFile(f"{path} is a link to {target}, outside {root}: the {what} is not "
                         "read through it; copy the file into the folder")
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{path} is {kind(st.st_mode)}, not a file: the {what} is not read")
    return path
