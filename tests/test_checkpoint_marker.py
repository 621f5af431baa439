"""The latest-checkpoint marker through the patch table's atomic_marker: megatron-core's own
tracker write (checkpointing's maybe_msc.open(tracker, 'w')) goes to a temp file, fsync and
rename, so a SIGKILL at any moment leaves the previous marker or the new one, never a cut one."""
from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from training import megatron_patches
from training.checkpoint_marker import AtomicMarkerStorage, write_marker
from training.checkpoint_scan import TRACKER

REPO = Path(__file__).resolve().parents[1]

def _write_forever(folder: Path) -> None:
    """Move the marker as Megatron's iter_finalize_fn does, through megatron's own module
    attribute with the patch applied, until killed (a forked child: megatron imported once)."""
    from megatron.training import checkpointing

    megatron_patches.apply(type("Run", (), {"args": None, "patched": []})(),
                           names=["atomic_marker"])
    tracker = checkpointing.get_checkpoint_tracker_filename(str(folder))
    i = 0
    while True:
        i += 1
        with checkpointing.maybe_msc.open(tracker, "w") as f:
            f.write(str(1000000 + i % 2))


def _kill_while_writing(folder: Path, kills: int) -> list[str]:
    """The marker's text after each of `kills` SIGKILLs at random moments of the writer."""
    import megatron.training.checkpointing  # noqa: F401  (imported before the fork)

    seen = []
    rng = random.Random(52)
    write_marker(folder / TRACKER, "1000000")
    for _ in range(kills):
        pid = os.fork()
        if pid == 0:   # the child never returns into pytest
            try:
                _write_forever(folder)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.05, 0.3))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        seen.append((folder / TRACKER).read_text())
    return seen


def test_a_sigkill_never_leaves_a_cut_marker(tmp_path):
    seen = _kill_while_writing(tmp_path, kills=20)
    assert all(text in ("1000000", "1000001") for text in seen), seen
    assert not [p for p in tmp_path.iterdir() if p.name != TRACKER and not p.name.startswith(".")]


def test_the_patch_is_what_megatron_writes_through(tmp_path):
    """The patch is in place on megatron's module, writes atomically, and leaves every other
    use of the storage facade (reads, os, other files) to megatron-core."""
    from megatron.training import checkpointing

    run = type("Run", (), {"args": None, "patched": []})()
    try:
        megatron_patches.apply(run, names=["atomic_marker"])
        storage = checkpointing.maybe_msc
        assert isinstance(storage, AtomicMarkerStorage)
        tracker = checkpointing.get_checkpoint_tracker_filename(str(tmp_path))
        with storage.open(tracker, "w") as f:
            f.write("10")
        assert Path(tracker).read_text() == "10"
        assert storage.os is os
        other = tmp_path / "other.txt"
        with storage.open(str(other), "w") as f:
            assert not isinstance(f, type(storage.open(tracker, "w")))
            f.write("x")
        # an error inside the write keeps the old marker
        with pytest.raises(RuntimeError):
            with storage.open(tracker, "w") as f:
                f.write("2")
                raise RuntimeError("killed")
        assert Path(tracker).read_text() == "10"
    finally:
        megatron_patches.restore(names=["atomic_marker"])
    assert not isinstance(checkpointing.maybe_msc, AtomicMarkerStorage)


def test_a_failed_rename_keeps_the_old_marker(tmp_path, monkeypatch):
    write_marker(tmp_path / TRACKER, "10")

    def killed(*_):
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        write_marker(tmp_path / TRACKER, "20")
    assert (tmp_path / TRACKER).read_text() == "10"
