"""The run folder and its manifest.

  <EXPERIMENT_DIR>/<EXP_NAME or model_nodes_parallelism_batch>/<precision tag>/<RUN_ID>/
      manifest.json   every resolved toggle (value, source, reason), the command, versions
      train.log       the whole torchrun output (the bash entrypoint tees it)
      metrics.jsonl   per-interval metrics (written by the run, rank 0)
      tensorboard/    TensorBoard events
      profile/        profiler traces and their report (PROFILE=torch|nsys)
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from training.reading import RecordError, read_json

PACKAGES = ("torch", "megatron-core", "transformer-engine", "transformer_engine_torch",
            "liger-kernel", "apex", "flash-attn", "triton", "transformers")


def default_run_name(preset_name: str, num_layers: int, preset_layers: int, nnodes: int,
                     gpus_per_node: int, tp: int, pp: int, cp: int, mbs: int, bs: int,
                     seq: int) -> str:
    layers = "" if num_layers == preset_layers else f"-{num_layers}L"
    return (f"{preset_name}{layers}_n{nnodes}x{gpus_per_node}_tp{tp}pp{pp}cp{cp}"
            f"_mbs{mbs}gbs{bs}_seq{seq}")


def node_log_name(nnodes: int, node_rank: int) -> str:
    """The log file a node tees its output to, inside the shared run folder."""
    return "train.log" if nnodes <= 1 else f"train.node{node_rank}.log"


def new_run_id(now: _dt.datetime | None = None) -> str:
    return (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")


def holds_run(folder: Path, nnodes: int, node_rank: int) -> str | None:
    """What in `folder` shows that a launch already ran there (not a DRY_RUN), or None.
    Node k>0 of a multi-node run shares node 0's folder: only its own log counts for it."""
    if not folder.is_dir():
        return None
    own_log = folder / node_log_name(nnodes, node_rank)
    if own_log.exists():
        return f"{own_log.name} is there"
    if nnodes > 1 and node_rank > 0:
        return None
    if (folder / "metrics.jsonl").exists():
        return "metrics.jsonl is there"
    try:
        manifest = read_json(folder / "manifest.json", "launcher manifest")
    except RecordError:
        return None
    if isinstance(manifest, dict) and manifest.get("dry_run") is False:
        return f"manifest.json of a launch at {manifest.get('created', 'an unknown time')}"
    return None


# Written beside manifest.json by the launcher: the folder is a run folder of ours, which a
# later launch (a DRY_RUN's folder, another node of the run) may write into.
MARKER = ".launcher-run"
# Folders a run folder never lands in (nor anywhere below them).
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                  "/run", "/sbin", "/sys", "/usr", "/var", "/snap")
SYSTEM_ALLOWED = ("/var/tmp",)


def is_ours(folder: Path) -> bool:
    """The folder holds our marker, or a manifest.json an earlier launcher wrote (its sections)."""
    if (folder / MARKER).is_file() and not (folder / MARKER).is_symlink():
        return True
    try:
        manifest = read_json(folder / "manifest.json", "launcher manifest")
    except RecordError:
        return False
    return isinstance(manifest, dict) and {"schema", "toggles", "command"} <= set(manifest)


def is_system_folder(folder: Path) -> bool:
    """/, a folder of the system (SYSTEM_FOLDERS or below, links followed) or your home folder."""
    real = Path(os.path.realpath(folder))
    text = str(real)
    return real == Path("/") or real == Path.home() or (
        any(text == d or text.startswith(d + "/") for d in SYSTEM_FOLDERS)
        and not any(text == d or text.startswith(d + "/") for d in SYSTEM_ALLOWED))


# What a launch writes into its run folder (the launcher, the run and the script's tee), each of
# which must be a plain file or absent: never written through a link, nor into a FIFO or device.
WRITTEN = (MARKER, "manifest.json", "launch.txt", "metrics.jsonl", "train.log")


def unsafe_entry(folder: Path, names=WRITTEN) -> str | None:
    """Why one of the files a launch writes in `folder` cannot be written (a link, a FIFO, a
    device, a folder), or None. train.node<N>.log counts as train.log does."""
    from training.safe_files import UnsafeFile, check_write_target

    try:
        extra = sorted(p.name for p in folder.glob("train.node*.log"))
    except OSError:
        extra = []
    for name in (*names, *extra):
        try:
            check_write_target(folder / name, name)
        except UnsafeFile as err:
            return str(err)
    return None


def ownership_problem(folder: Path) -> str | None:
    """Why the launcher may not write into `folder`: it is a system folder, it holds files
    and is not a run folder of ours, or a file the launch writes there is a link or a special
    file. None: missing, empty, or ours."""
    if is_system_folder(folder):
        return f"{folder} is a system folder (or your home folder itself)"
    if folder.is_dir():
        unsafe = unsafe_entry(folder)
        if unsafe:
            return unsafe
    real = Path(os.path.realpath(folder))
    try:
        entries = next(os.walk(real))[1:] if real.is_dir() else ([], [])
    except StopIteration:
        entries = ([], [])
    if (entries[0] or entries[1]) and not is_ours(real):
        return (f"{folder} holds files and is not a run folder of this launcher (no {MARKER} "
                "or launcher manifest.json in it)")
    return None


def folder_problem(path: Path) -> str | None:
    """Why `path` cannot be used as a folder to write into (created if missing), or None:
    it, or the nearest existing folder above it, must be a writable folder."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user"
    return None


def run_dir(experiment_dir: str, name: str, tag: str, run_id: str) -> Path:
    return Path(experiment_dir) / name / tag / run_id


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_sha(repo: Path) -> str | None:
    """HEAD of the checkout (+"-dirty" with uncommitted tracked changes). The GIT_SHA
    variable, when set, says it instead: a tree copied to a GPU machine may carry no .git, or a
    stale one (it named an older commit, "-dirty", on the lent H200s)."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    if shutil.which("git") is None or not (repo / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GIT_SHA")
    sha = out.stdout.strip()
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return sha + ("-dirty" if dirty else "")


def mark_ours(folder: Path) -> None:
    """Leave the marker that makes `folder` a run folder of this launcher."""
    from training.safe_files import write_text

    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / MARKER, "a run folder of python -m training.launch (manifest.json)\n",
               "run-folder marker")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    from training.safe_files import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", path.name)


def read_manifest(run: Path) -> dict[str, Any]:
    """RUN's manifest.json (training.reading: bounded, one RecordError line when unreadable)."""
    data = read_json(run / "manifest.json", "launcher manifest")
    if not isinstance(data, dict):
        raise RecordError(f"{run / 'manifest.json'}: not a launcher manifest (a JSON object)")
    return data


def update_manifest(run: Path, key: str, value: Any) -> None:
    """Add one section to an existing manifest (used by the run, rank 0)."""
    path = run / "manifest.json"
    data = read_manifest(run) if path.exists() else {}
    data[key] = value
    write_json_atomic(path, data)
