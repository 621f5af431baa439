"""Writes never follow a link or block on a special file; reads of a special file are refused at
once; a file from a source folder stays inside it (training/safe_files.py), over the class:
every kind of non-file where a file is expected, for every way the project writes."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from training import safe_files
from training.cli import BadFile
from training.safe_files import UnsafeFile

WRITERS = {
    "write_text": lambda p: safe_files.write_text(p, "new\n", "test file"),
    "write_atomic": lambda p: safe_files.write_atomic(p, "new\n", "test file"),
    "open_write(append)": lambda p: safe_files.open_write(p, "test file", append=True).close(),
    "open_write(binary)": lambda p: safe_files.open_write(p, "test file", binary=True).close(),
}


def _link_out(tmp_path):
    target = tmp_path / "outside"
    target.write_text("precious\n")
    os.symlink(target, tmp_path / "f")
    return target


def _dangling_link(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "f")
    return tmp_path / "nowhere"


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "f")


def _folder(tmp_path):
    (tmp_path / "f").mkdir()


def _socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "f"))
    return sock


NOT_FILES = {"a link out": (_link_out, "symbolic link"),
             "a dangling link": (_dangling_link, "symbolic link"),
             "a FIFO": (_fifo, "FIFO"), "a folder": (_folder, "folder"),
             "a socket": (_socket, "socket")}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("case", sorted(NOT_FILES))
def test_no_writer_writes_through_a_non_file(tmp_path, writer, case):
    make, words = NOT_FILES[case]
    made = make(tmp_path)
    done = []

    def attempt():
        with pytest.raises(UnsafeFile, match=words) as err:
            WRITERS[writer](tmp_path / "f")
        done.append(err.value)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(20)    # a FIFO would block an unguarded open for ever: a generous bound
    if thread.is_alive():   # unblock the writer so the test process can end
        with open(tmp_path / "f", "rb"):
            pass
        pytest.fail(f"{writer} blocked on {case}")
    assert done and isinstance(done[0], BadFile) and "\n" not in str(done[0])
    if case == "a link out":
        assert made.read_text() == "precious\n"
    if case == "a dangling link":
        assert not made.exists()


def test_a_device_is_refused_for_writing_and_reading():
    with pytest.raises(UnsafeFile, match="character device"):
        safe_files.write_text("/dev/null", "x", "test file")
    with pytest.raises(UnsafeFile, match="character device"):
        safe_files.read_text("/dev/zero", "test file")


def test_a_fifo_is_refused_for_reading_at_once(tmp_path):
    os.mkfifo(tmp_path / "p")
    with pytest.raises(UnsafeFile, match="FIFO"):
        safe_files.read_text(tmp_path / "p", "test file")


def test_regular_files_are_written_and_replaced(tmp_path):
    for name, writer in WRITERS.items():
        path = tmp_path / name
        writer(path)
        writer(path)
        assert path.is_file() and not path.is_symlink()
    safe_files.write_atomic(tmp_path / "a", "one", "x")
    safe_files.write_atomic(tmp_path / "a", "two", "x")
    assert safe_files.read_text(tmp_path / "a", "x") == "two"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_source_file_stays_inside_its_folder(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "real").write_text("x")
    os.symlink("real", root / "inner")
    os.symlink(tmp_path / "secret", root / "outer")
    (tmp_path / "secret").write_text("s")
    os.symlink("../secret", root / "climb")
    assert safe_files.source_file(root / "inner", root, "f") == root / "inner"
    for name in ("outer", "climb"):
        with pytest.raises(UnsafeFile, match="outside"):
            safe_files.source_file(root / name, root, "f")
    os.mkfifo(root / "pipe")
    with pytest.raises(UnsafeFile, match="FIFO"):
        safe_files.source_file(root / "pipe", root, "f")
