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
import shutil
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
    if not path.is_file():
        raise HFError(f"{folder} has no config.json: not a Hugging Face model folder")
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


def _read_header(path: Path) -> dict[str, TensorEntry]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= length <= size - 8:
            raise HFError(f"{path} is not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise HFError(f"{path} is not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise HFError(f"{path} is not a safetensors file (header is not a JSON object)")
    entries = {}
    base = 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise HFError(f"{path} is not a safetensors file (entry {name} is not an object)")
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise HFError(f"{path}: tensor {name} has dtype {info.get('dtype')}; this converts "
                          f"{', '.join(DTYPES)}")
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = tuple(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError):
            raise HFError(f"{path} is not a safetensors file (tensor {name} lacks a valid "
                          "data_offsets or shape)") from None
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * dtype.itemsize or base + end > size:
            raise HFError(f"{path}: tensor {name} does not fit the file (truncated download?)")
        entries[name] = TensorEntry(path, dtype, shape, base + begin, end - begin)
    return entries


class SafetensorsFolder:
    """Every tensor of a model folder (single file or sharded with an index), read by rows."""

    def __init__(self, folder: Path):
        index = folder / INDEX
        if index.is_file():
            weight_map = read_object(index, "safetensors index").get("weight_map", {})
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise HFError(f"{index}: its weight_map is not an object of file names")
            files = sorted({folder / f for f in weight_map.values()})
        elif (folder / SINGLE_FILE).is_file():   # as transformers reads a folder
            files = [folder / SINGLE_FILE]
        else:
            files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise HFError(f"{folder} holds no *.safetensors files (only safetensors weights "
                          "are read; convert a .bin checkpoint with transformers first)")
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise HFError(f"{folder}: {INDEX} names missing files: {', '.join(missing)}")
        self.entries: dict[str, TensorEntry] = {}
        for path in files:
            self.entries.update(_read_header(path))
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
    """config, generation config and tokenizer files from one folder to another."""
    copied = []
    for name in SIDE_FILES:
        if (source / name).is_file():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)
            copied.append(name)
    return copied


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
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total_size},
                                            "weight_map": weight_map}, indent=2) + "\n")
