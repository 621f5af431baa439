"""A Hugging Face model folder: its config, its safetensors tensors, and the files an export writes.

Reading: each file's safetensors header (an 8-byte length, then JSON: name -> dtype, shape and
byte range; the format's specification) locates every tensor, and os.preadv reads the rows a
Megatron tensor needs straight into that tensor's buffer. safetensors' safe_open maps the
whole file instead: every page a read touches stays in the process's resident memory until the
handle closes (measured with safetensors 0.8: a 1 GB file read tensor by tensor through one
handle ended at 1.2 GB of resident file pages), and its tensors then need a copy into place.
Writing (the export): safetensors.torch.save_file, one bounded shard at a time.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from training.cli import BadFile
from training.reading import read_json

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
          "U8": torch.uint8}   # U8: MXFP4 blocks and scales (gpt-oss's experts)
CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files an import keeps beside the checkpoint (OUT/hf/) and an export puts back: what lm-eval
# and vLLM read besides the weights.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HFError(ValueError):
    """A Hugging Face folder that cannot be read (message printed as is)."""


def resolve_source(arg: str, check=None) -> Path:
    """A local folder, or a Hub repository id downloaded with huggingface_hub where reachable:
    its config.json first, handed to `check` (which raises on a model this does not convert)
    before a single weight file is fetched."""
    path = Path(arg)
    if path.is_dir():
        return path
    if path.exists():
        raise HFError(f"{arg} is a file: give the folder that holds config.json and the "
                      "*.safetensors files")
    if not _REPO_ID.match(arg) or arg.startswith((".", "/")):
        raise HFError(f"no folder {arg}: give a Hugging Face model folder (config.json and "
                      "*.safetensors) or a Hub repository id such as meta-llama/Llama-3.1-8B")
    from huggingface_hub import hf_hub_download, snapshot_download

    try:
        config = Path(hf_hub_download(arg, CONFIG))
    except Exception as err:   # offline, gated, unknown repo: one line, the hub's own reason
        raise HFError(_hub_failure(arg, err)) from None
    if check is not None:
        check(read_object(config, "Hugging Face config.json"))
    try:
        weights = _hub_weight_files(arg, hf_hub_download)
        return Path(snapshot_download(arg, allow_patterns=["*.json", "tokenizer.model",
                                                           *weights]))
    except HFError:
        raise
    except Exception as err:
        raise HFError(_hub_failure(arg, err)) from None


def _hub_weight_files(arg: str, hf_hub_download) -> list[str]:
    """The safetensors files a Hub repository's model is in, as transformers reads them: those
    its index names, else model.safetensors. A repository may hold the weights twice (Mistral's
    consolidated.safetensors beside the sharded ones): only these are downloaded."""
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        index = Path(hf_hub_download(arg, INDEX))
    except RemoteEntryNotFoundError:
        return [SINGLE_FILE]
    weight_map = read_object(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(f, str) for f in weight_map.values()):
        raise HFError(f"{arg}: its {INDEX}'s weight_map is not an object of file names")
    return sorted(set(weight_map.values()))


def _hub_failure(arg: str, err: Exception) -> str:
    """One line for a failed Hub download; an offline machine (HF_HUB_OFFLINE, or no network)
    is named as such."""
    from huggingface_hub import constants

    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    offline = constants.HF_HUB_OFFLINE or type(err).__name__ in (
        "OfflineModeIsEnabled", "LocalEntryNotFoundError") or isinstance(
        err, (ConnectionError, TimeoutError, OSError)) and "connect" in reason.lower()
    if offline:
        return (f"no folder {arg}, and the Hugging Face Hub cannot be reached from here "
                f"(offline: {reason}): download the model where the Hub is reachable and give "
                "its folder")
    return f"no folder {arg}, and downloading it from the Hugging Face Hub failed: {reason}"


def read_object(path: Path, what: str) -> dict:
    """The JSON object in `path`; HFError (one line) when it is missing, unreadable, cut short or
    not an object."""
    try:
        value = read_json(path, what)
    except BadFile as err:
        raise HFError(str(err)) from None
    if not isinstance(value, dict):
        raise HFError(f"{path}: not a {what}: a JSON {type(value).__name__}, not an object")
    return value


def load_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not (path.exists() or path.is_symlink()):
        raise HFError(f"{folder} has no config.json: not a Hugging Face model folder")
    _source(path, folder, "Hugging Face config.json")   # its text goes into the import's record
    return read_object(path, "Hugging Face config.json")


@dataclass(frozen=True)
class TensorEntry:
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int          # absolute byte offset of the data in the file
    nbytes: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of the tensor seen as 2-D (a 1-D tensor's: one element)."""
        if len(self.shape) > 1:
            return self.shape[-1] * self.dtype.itemsize
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def source_root(folder: Path) -> Path:
    """The folder a model folder's files may lead into through links: the folder itself, or,
    for a Hugging Face Hub snapshot (.../models--ORG--NAME/snapshots/<commit>/, whose files are
    links to ../../blobs/), the repository's cache folder."""
    folder = Path(os.path.realpath(folder))
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return folder


def _source(path: Path, folder: Path, what: str) -> Path:
    """A file of the model folder, refused (HFError) when it is a link out of the folder (or
    its Hub cache) or not a regular file."""
    from training.safe_files import UnsafeFile, source_file

    try:
        return source_file(path, source_root(folder), what)
    except UnsafeFile as err:
        raise HFError(str(err)) from None


def _read_header(path: Path) -> dict[str, TensorEntry]:
    """The file's tensors, its header held to the format's rules (safetensors_file)."""
    from .safetensors_file import HeaderError, read_header

    try:
        raw = read_header(path)
    except HeaderError as err:
        raise HFError(str(err)) from None
    except OSError as err:
        raise HFError(f"{path}: cannot read it ({err.strerror or err})") from None
    entries = {}
    for name, entry in raw.items():
        dtype = DTYPES.get(entry.dtype)
        if dtype is None:
            raise HFError(f"{path}: tensor {name} has dtype {entry.dtype}; this converts "
                          f"{', '.join(DTYPES)}")
        entries[name] = TensorEntry(path, dtype, entry.shape, entry.begin, entry.nbytes)
    return entries


class SafetensorsFolder:
    """Every tensor of a model folder (single file or sharded with an index), read by rows."""

    def __init__(self, folder: Path):
        index = folder / INDEX
        weight_map = None
        if index.is_file():
            _source(index, folder, "safetensors index")
            weight_map = read_object(index, "safetensors index").get("weight_map", {})
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise HFError(f"{index}: its weight_map is not an object of file names")
            outside = [f for f in weight_map.values() if Path(f).name != f or f in (".", "..")]
            if outside:
                raise HFError(f"{index}: its weight_map names {outside[0]!r}, not a file of the "
                              "folder: the weights are read from the model folder only")
            files = sorted({folder / f for f in weight_map.values()})
        elif (folder / SINGLE_FILE).is_file():   # as transformers reads a folder
            files = [folder / SINGLE_FILE]
        else:
            files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise HFError(f"{folder} holds no *.safetensors files (only safetensors weights "
                          "are read; convert a .bin checkpoint with transformers first)")
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise HFError(f"{folder}: {INDEX} names missing files: {', '.join(missing)}")
        self.entries: dict[str, TensorEntry] = {}
        for path in files:
            _source(path, folder, "safetensors file")
            for name, entry in _read_header(path).items():
                if name in self.entries:   # which one a reader gets would depend on the order
                    raise HFError(f"{folder}: tensor {name} is in both {self.entries[name].path.name}"
                                  f" and {path.name}: one tensor, one file")
                self.entries[name] = entry
        if weight_map is not None:   # the index and the files say the same
            for name, entry in self.entries.items():
                if weight_map.get(name) != entry.path.name:
                    raise HFError(f"{entry.path} holds {name}, which {INDEX} places "
                                  f"{'in ' + weight_map[name] if name in weight_map else 'nowhere'}"
                                  ": the index and the files disagree")
            absent = [n for n in weight_map if n not in self.entries]
            if absent:
                raise HFError(f"{index} places {absent[0]} in {weight_map[absent[0]]}, which "
                              "does not hold it")
        self._fds: dict[Path, int] = {}

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def read_rows(self, name: str, row: int, rows: int, out: torch.Tensor) -> None:
        """Rows [row, row + rows) of tensor `name` into the contiguous tensor `out`."""
        entry = self.entries[name]
        want = rows * entry.row_bytes
        if not out.is_contiguous() or out.nbytes != want or out.device.type != "cpu":
            raise ValueError(f"{name}: {out.nbytes} bytes of room for {want}")
        # A view of the tensor's memory (through ctypes, not numpy: a storage numpy has seen
        # cannot be freed early by resize_(0), which the checkpoint writer does).
        buf = memoryview((ctypes.c_char * want).from_address(out.data_ptr())).cast("B")
        fd = self._fd(entry.path)
        offset, done = entry.start + row * entry.row_bytes, 0
        while done < want:
            n = os.preadv(fd, [buf[done:]], offset + done)
            if n <= 0:
                raise HFError(f"{entry.path} ended early while reading {name}")
            done += n

    def prefetch(self, name: str, row: int, rows: int) -> None:
        """Ask the kernel to start reading these rows into its page cache (not this process's
        memory), so the disk reads them while the caller writes what it read before."""
        entry = self.entries[name]
        os.posix_fadvise(self._fd(entry.path), entry.start + row * entry.row_bytes, rows * entry.row_bytes,
                         os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def copy_side_files(source: Path, target: Path) -> list[str]:
    """config, generation config and tokenizer files from one folder to another: only regular
    files inside the source folder (HFError for a link out of it: a tokenizer.model that leads
    to a private file is not copied into the output)."""
    from training.safe_files import read_bytes

    copied = []
    for name in SIDE_FILES:
        path = source / name
        if not (path.exists() or path.is_symlink()):
            continue
        _source(path, source, name)
        target.mkdir(parents=True, exist_ok=True)
        with _write(target / name, name, binary=True) as out:
            out.write(read_bytes(path, name))
        copied.append(name)
    return copied


def _write(path: Path, what: str, binary: bool = False):
    from training.safe_files import open_write

    return open_write(path, what, binary=binary)


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors spelling of a dtype this converts (BF16, F16, F32, U8)."""
    return next(name for name, d in DTYPES.items() if d == dtype)


def write_config(folder: Path, config: dict) -> None:
    with _write(folder / CONFIG, CONFIG) as out:
        out.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def shard_groups(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Consecutive tensors grouped into shards of at most max_bytes (one tensor may exceed it)."""
    groups, current, used = [], [], 0
    for name, nbytes in sizes.items():
        if current and used + nbytes > max_bytes:
            groups.append(current)
            current, used = [], 0
        current.append(name)
        used += nbytes
    if current:
        groups.append(current)
    return groups


def shard_file_name(index: int, count: int) -> str:
    if count == 1:
        return "model.safetensors"
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def write_index(folder: Path, weight_map: dict[str, str], total_size: int) -> None:
    with _write(folder / INDEX, "safetensors index") as out:
        out.write(json.dumps({"metadata": {"total_size": total_size},
                              "weight_map": weight_map}, indent=2) + "\n")
