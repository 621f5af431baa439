"""Faults while a dataset is prepared, and damaged datasets: what survives, what the user is told.

Every fault leaves one of: the old dataset intact (byte for byte, and it still verifies), or no
dataset at all; never temporary files, a lock, or a dataset that looks complete but is not.

- truncated inputs of every compression (.gz, .zst, .bz2, .xz), cut in half and cut early
- two runs on one prefix at once (two processes; the first one held still with SIGSTOP once its
  temporary .bin exists, so the second one meets it mid-run every time)
- SIGTERM, SIGHUP, SIGINT mid-run (the same handshake: the signal is sent while the writer is
  stopped, and acts when it continues), SIGTERM to the whole process group with worker processes
- a write that fails (RLIMIT_FSIZE with SIGXFSZ ignored: the kernel's EFBIG from a real write, the
  way a full disk gives ENOSPC), and the message for ENOSPC itself
- temporary files of a run that is gone, cleaned by the next run
- a damaged .idx: refused by `check verify`, by the launcher's check, and by `adopt`
"""
from __future__ import annotations

import bz2
import errno
import gzip
import json
import lzma
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard
from datatest_utils import run_cli, write_jsonl

from training.data import check, index
from training.data import prepare as prep
from training.data.check import DataPathError, check_data_path
from training.data.publish import os_error_message

pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")
REPO = Path(__file__).resolve().parents[2]
SUFFIXES = (".bin", ".idx", ".dataset.json")


def _files(prefix: Path) -> dict[str, bytes]:
    return {ext: (Path(str(prefix) + ext)).read_bytes() for ext in SUFFIXES}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock"))


def _assert_old_dataset_intact(prefix: Path, before: dict[str, bytes]) -> None:
    assert _files(prefix) == before
    check_data_path(str(prefix), None, hash_bin=True, megatron=True)
    assert _leftovers(prefix.parent) == []


@pytest.fixture
def old(tmp_path, corpus_texts, tok_dir):
    """A complete dataset at tmp/out/ds (the one a failed --overwrite run must leave alone)."""
    src = write_jsonl(tmp_path / "old.jsonl", corpus_texts[:20])
    prefix = tmp_path / "out" / "ds"
    prep.prepare([src], str(prefix), tok_dir, progress=False, workers=1)
    return prefix, _files(prefix)


# ----------------------------------------------------------------------------- truncated inputs

def _compressed(suffix: str, data: bytes) -> bytes:
    if suffix == ".zst":
        return zstandard.ZstdCompressor().compress(data)
    return {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix](data)


@pytest.mark.parametrize("cut", ["half", "early"])
@pytest.mark.parametrize("suffix", [".gz", ".zst", ".bz2", ".xz"])
def test_a_truncated_compressed_input_fails_the_run_and_keeps_the_old_dataset(
        tmp_path, corpus_texts, tok_dir, old, capsys, suffix, cut):
    prefix, before = old
    data = "".join(json.dumps({"text": t}) + "\n" for t in corpus_texts).encode()
    blob = _compressed(suffix, data)
    path = tmp_path / f"cut.jsonl{suffix}"
    path.write_bytes(blob[: len(blob) // 2] if cut == "half" else blob[:12])
    rc, out, err = run_cli(prep.main, [str(path), "--tokenizer", tok_dir, "--output-prefix", str(prefix),
                                       "--overwrite", "--no-progress"], capsys)
    assert rc == 1
    assert err.strip().splitlines() == [err.strip()]
    assert f"{path}: cannot read the {suffix[1:]} file" in err
    _assert_old_dataset_intact(prefix, before)


def test_a_zst_of_several_frames_reads_to_its_end(tmp_path, corpus_texts, tok_dir):
    data = [("".join(json.dumps({"text": t}) + "\n" for t in part)).encode()
            for part in (corpus_texts[:50], corpus_texts[50:])]
    streaming = zstandard.ZstdCompressor().compressobj()  # a frame without a content size
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data[0])
                     + streaming.compress(data[1]) + streaming.flush())
    summary = prep.prepare([str(path)], str(tmp_path / "ds"), tok_dir, progress=False, workers=1)
    assert summary.documents == len(corpus_texts)


# ----------------------------------------------------------------------------- processes

def _start(argv: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "training.data.prepare", *argv, "--no-progress"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def _stop_once_writing(proc: subprocess.Popen, prefix: Path, group: bool = False) -> None:
    """Wait until `proc` has created its temporary .bin (it holds the lock and is writing), then
    stop it there (SIGSTOP). A guard against hanging, not a timing: 300 s for a start that takes
    seconds."""
    deadline = time.monotonic() + 300
    while not list(prefix.parent.glob(prefix.name + ".bin.tmp-*")):
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it wrote anything: {proc.communicate()}")
        assert time.monotonic() < deadline, "the run never started writing"
        time.sleep(0.05)
    (os.killpg if group else os.kill)(proc.pid, signal.SIGSTOP)


def _big_input(tmp_path: Path, corpus_texts) -> str:
    return write_jsonl(tmp_path / "new.jsonl", corpus_texts * 3)


@pytest.mark.slow
def test_a_second_run_on_the_same_prefix_is_refused_while_the_first_writes(
        tmp_path, corpus_texts, tok_dir, old, capsys):
    prefix, _ = old
    source = _big_input(tmp_path, corpus_texts)
    first = _start([source, "--tokenizer", tok_dir, "--output-prefix", str(prefix), "--overwrite", "--workers", "1"])
    try:
        _stop_once_writing(first, prefix)
        rc, _, err = run_cli(prep.main, [source, "--tokenizer", tok_dir, "--output-prefix", str(prefix),
                                         "--overwrite", "--no-progress"], capsys)
        assert rc == 2
        assert f"another run (pid {first.pid} on {socket.gethostname()}" in err
        assert "is writing this dataset now" in err and len(err.strip().splitlines()) == 1
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate()
    assert first.returncode == 0, err
    record = json.loads(Path(str(prefix) + ".dataset.json").read_text())
    assert record["documents"] == 3 * len(corpus_texts)  # the first run's dataset, whole
    check_data_path(str(prefix), None, hash_bin=True, megatron=True)
    assert _leftovers(prefix.parent) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig,group,workers", [
    (signal.SIGINT, False, 1),    # Ctrl-C
    (signal.SIGHUP, False, 1),    # the terminal went away
    (signal.SIGTERM, True, 2),    # Slurm/docker/timeout: the whole process group, workers included
])
def test_a_signal_mid_run_removes_the_temporary_files_and_keeps_the_old_dataset(
        tmp_path, corpus_texts, tok_dir, old, sig, group, workers):
    prefix, before = old
    proc = _start([_big_input(tmp_path, corpus_texts), "--tokenizer", tok_dir, "--output-prefix", str(prefix),
                   "--overwrite", "--workers", str(workers), "--chunk-mb", "0.01"], start_new_session=group)
    send = os.killpg if group else os.kill
    try:
        _stop_once_writing(proc, prefix, group)
        send(proc.pid, sig)
    finally:
        send(proc.pid, signal.SIGCONT)
    out, err = proc.communicate()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig
    assert err.strip() == f"interrupted by {name}: nothing written (temporary files removed)"
    assert out == ""
    _assert_old_dataset_intact(prefix, before)


# The run with one fault injected into multiprocessing (not into the code under test): right after
# the first worker process is launched, before the pool has recorded it, the run sends itself
# SIGTERM; the handler runs at that point, in the middle of the pool's start.
_SIGNAL_WHILE_THE_POOL_STARTS = """
import os, signal, sys
from multiprocessing import popen_spawn_posix
launch = popen_spawn_posix.Popen._launch
def launch_then_signal(self, process_obj):
    launch(self, process_obj)
    if not getattr(launch_then_signal, "sent", False):
        launch_then_signal.sent = True
        os.kill(os.getpid(), signal.SIGTERM)
popen_spawn_posix.Popen._launch = launch_then_signal
from training.data import prepare
sys.exit(prepare.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_signal_while_the_worker_pool_starts_is_one_line_and_keeps_the_old_dataset(
        tmp_path, corpus_texts, tok_dir, old):
    prefix, before = old
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_WHILE_THE_POOL_STARTS, _big_input(tmp_path, corpus_texts), "--tokenizer",
         tok_dir, "--output-prefix", str(prefix), "--overwrite", "--workers", "2", "--no-progress"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)  # a guard against a pool that cannot shut down
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the run hung after a signal while its worker pool started: {err[-2000:]}")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip() == "interrupted by SIGTERM: nothing written (temporary files removed)"
    assert out == ""
    _assert_old_dataset_intact(prefix, before)


def _limit_file_size(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.slow
def test_a_write_that_fails_for_space_is_one_line_and_leaves_nothing(tmp_path, corpus_texts, tok_dir, old):
    prefix, before = old
    proc = _start([_big_input(tmp_path, corpus_texts), "--tokenizer", tok_dir, "--output-prefix", str(prefix),
                   "--overwrite", "--workers", "1"], preexec_fn=_limit_file_size(len(before[".bin"])))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"error: no space to write {prefix} (File too large); temporary files removed, "
                           f"nothing published. Free space under {prefix.parent}")
    _assert_old_dataset_intact(prefix, before)


def test_the_no_space_message_says_what_to_do(tmp_path):
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        e = OSError(code, os.strerror(code), str(tmp_path / "ds.bin.tmp-x"))
        line = os_error_message(e, str(tmp_path / "ds"))
        assert line.startswith(f"no space to write {tmp_path}/ds.bin.tmp-x ({os.strerror(code)})")
        assert f"Free space under {tmp_path}" in line
    assert "no space" not in os_error_message(OSError(errno.EIO, "I/O error"), "p")


def test_temporary_files_of_a_run_that_is_gone_are_removed_and_said(tmp_path, corpus_texts, tok_dir, capsys):
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    alive = subprocess.Popen(["sleep", "300"])
    try:
        out = tmp_path / "out"
        out.mkdir()
        host = socket.gethostname()
        stale = [out / f"ds.bin.tmp-{host}-{gone.pid}", out / f"ds.idx.tmp-{gone.pid}"]  # this and the old format
        running = out / f"ds.bin.tmp-{host}-{alive.pid}"
        elsewhere = out / f"ds.bin.tmp-another-host-{alive.pid}"
        for p in [*stale, running, elsewhere]:
            p.write_bytes(b"\0" * 1000)
        src = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:10])
        rc, _, err = run_cli(prep.main, [src, "--tokenizer", tok_dir, "--output-prefix", str(out / "ds"),
                                         "--no-progress"], capsys)
        assert rc == 0
        lines = err.strip().splitlines()
        assert lines[0] == (f"removed 2 temporary file(s) of an earlier run that is gone (pid {gone.pid}): "
                            f"{stale[0].name}, {stale[1].name}")
        assert lines[1].startswith(f"note: {elsewhere} belong(s) to a run on another host; left alone")
        assert not any(p.exists() for p in stale)
        assert running.exists() and elsewhere.exists()
    finally:
        alive.kill()
        alive.wait()


# ----------------------------------------------------------------------------- publishing

def test_the_record_names_the_files_of_its_own_run(tmp_path, corpus_texts, tok_dir):
    src = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:30])
    prefix = tmp_path / "ds"
    prep.prepare([src], str(prefix), tok_dir, progress=False, workers=1)
    record = json.loads((tmp_path / "ds.dataset.json").read_text())
    from training.data.tokenizer import file_sha256

    for ext in ("bin", "idx"):
        path = f"{prefix}.{ext}"
        assert record[f"{ext}_bytes"] == os.path.getsize(path)
        assert record[f"{ext}_sha256"] == file_sha256(path)
    assert _leftovers(tmp_path) == []


def test_a_prefix_that_data_path_cannot_name_is_refused_before_anything(tmp_path, corpus_texts, tok_dir, capsys,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:5])
    for prefix, words in (("", "empty"), ("my data/x", "contains whitespace"), ("0.5", "write ./0.5")):
        rc, _, err = run_cli(prep.main, [src, "--tokenizer", tok_dir, "--output-prefix", prefix], capsys)
        assert rc == 2 and words in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]


@pytest.mark.slow
def test_skip_complete_keeps_a_verified_dataset_and_rebuilds_nothing(tmp_path, corpus_texts, tok_dir, capsys):
    src = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:30])
    prefix = tmp_path / "ds"
    argv = [src, "--tokenizer", tok_dir, "--output-prefix", str(prefix), "--no-progress", "--skip-complete"]
    assert run_cli(prep.main, argv, capsys)[0] == 0
    stamp = os.stat(f"{prefix}.bin").st_mtime_ns
    rc, out, _ = run_cli(prep.main, argv, capsys)
    assert rc == 0 and "complete and verified" in out and "kept, nothing to do" in out
    assert os.stat(f"{prefix}.bin").st_mtime_ns == stamp
    # other inputs: refused without --overwrite, rebuilt with it
    other = write_jsonl(tmp_path / "b.jsonl", corpus_texts[30:40])
    rc, _, err = run_cli(prep.main, [other, *argv[1:]], capsys)
    assert rc == 2 and f"made from other inputs ({src} of " in err and f"where {other} of " in err
    assert err.rstrip().endswith("pass --overwrite to replace it")
    # a damaged .bin: not complete, so not kept
    data = bytearray(Path(f"{prefix}.bin").read_bytes())
    data[10] ^= 1
    Path(f"{prefix}.bin").write_bytes(bytes(data))
    rc, _, err = run_cli(prep.main, argv, capsys)
    assert rc == 2 and "SHA-256 differs" in err
    assert run_cli(prep.main, argv + ["--overwrite"], capsys)[0] == 0
    check_data_path(str(prefix), None, hash_bin=True)


# ----------------------------------------------------------------------------- damaged .idx

def _copy(src: str, dst: Path) -> Path:
    for ext in SUFFIXES:
        shutil.copy(src + ext, str(dst) + ext)
    return dst


@pytest.fixture(scope="module")
def two(tmp_path_factory, corpus_texts, tok_dir):
    root = tmp_path_factory.mktemp("idx")
    for name, texts in (("a", corpus_texts[:40]), ("b", corpus_texts[40:55])):
        prep.prepare([write_jsonl(root / f"{name}.jsonl", texts)], str(root / name), tok_dir, progress=False,
                     workers=1)
    return root


def test_the_index_reader_agrees_with_megatrons(two):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    facts = index.read_index(f"{two}/a.idx", f"{two}/a.bin")
    ds = IndexedDataset(f"{two}/a", mmap=True)
    assert facts.sequences == len(ds) == facts.documents == len(ds.document_indices) - 1
    assert facts.tokens == int(ds.sequence_lengths.sum())
    assert facts.dtype == np.dtype(ds.index.dtype)
    from megatron.core.datasets import indexed_dataset as mid

    assert index.HEADER == mid._INDEX_HEADER
    assert {c: d for c, d in index.TOKEN_DTYPES.items()} == {
        c: mid.DType.dtype_from_code(c) for c in index.TOKEN_DTYPES}


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-9])


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(p.stat().st_size))


def _header_only(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:34])


def _pointer_off(p: Path) -> None:
    data = bytearray(p.read_bytes())
    seqs = int.from_bytes(data[18:26], "little")
    at = 34 + 4 * seqs + 8 * 3  # sequence 3 starts one token late
    data[at:at + 8] = (int.from_bytes(data[at:at + 8], "little") + 2).to_bytes(8, "little")
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,words", [
    (_truncate, "has"), (_garbage, "not a Megatron index"), (_header_only, "truncated"),
    (_pointer_off, "sequence 3 starts at byte"),
])
def test_a_damaged_idx_is_refused_by_every_check(two, tmp_path, tok_dir, capsys, damage, words):
    prefix = _copy(f"{two}/a", tmp_path / "a")
    damage(Path(f"{prefix}.idx"))
    if damage is not _truncate:  # keep the recorded size, so the index itself is read and judged
        record = json.loads(Path(f"{prefix}.dataset.json").read_text())
        record.pop("idx_bytes")
        Path(f"{prefix}.dataset.json").write_text(json.dumps(record))
    with pytest.raises(DataPathError, match=words):
        check_data_path(str(prefix), None)  # the launcher's check
    rc, _, err = run_cli(check.main, ["verify", str(prefix)], capsys)
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1
    os.remove(f"{prefix}.dataset.json")
    rc, _, err = run_cli(check.main, ["adopt", str(prefix), "--tokenizer-model", tok_dir], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert not os.path.exists(f"{prefix}.dataset.json")


def test_an_idx_from_another_preparation_is_refused(two, tmp_path):
    prefix = _copy(f"{two}/a", tmp_path / "a")
    shutil.copy(f"{two}/b.idx", f"{prefix}.idx")  # the mix two unlocked runs could publish
    with pytest.raises(DataPathError, match="a.idx has .* bytes but its record says"):
        check_data_path(str(prefix), None)
    record = json.loads(Path(f"{prefix}.dataset.json").read_text())
    for key in ("idx_bytes", "idx_sha256"):  # a record without them (written before they existed)
        record.pop(key)
    Path(f"{prefix}.dataset.json").write_text(json.dumps(record))
    with pytest.raises(DataPathError, match="not one dataset"):
        check_data_path(str(prefix), None)

