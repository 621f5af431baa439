"""The Megatron side: a distributed checkpoint written tensor by tensor, and read layer by layer.

A checkpoint folder as megatron.training saves and loads it (`--ckpt-format torch_dist`):

    OUT/latest_checkpointed_iteration.txt    "release" (an import) or the iteration
    OUT/release/  (or iter_0000020/)         the distributed checkpoint:
        metadata.json                        {"sharded_backend": "torch_dist", ...}
        .metadata, __0_0.distcp              torch.distributed.checkpoint's index and data

Megatron reads a "release" checkpoint as weights only: iteration 0, no optimizer or RNG state
(megatron/training/checkpointing.py), which is what starting from an import means.

Writing goes through torch.distributed.checkpoint's own FileSystemWriter with a planner that
describes each chunk up front (key, global shape, offsets, dtype) and produces its tensor only
when the writer asks for it (resolve_data), one at a time; the previous chunk's memory is
released then, so the writer holds one chunk. The global tensors, their chunking and the
common state follow what Megatron's GPTModel.sharded_state_dict and dist_checkpointing.save
write, so Megatron's own loader reshards them to any TP/PP/DP.
"""
from __future__ import annotations

import io
import json
import logging
import re
import threading
from pathlib import Path
from typing import Callable

import torch

from training.launch.guards import CHECKPOINT_TRACKER as TRACKER

from .layout import MegatronTensor

log = logging.getLogger(__name__)

RELEASE = "release"
CONFIG = "metadata.json"
CHECKPOINT_VERSION = 3.0                        # what megatron.training saves (no QKV reorder)
# The content metadata megatron.training 0.19.2 records with a save
# (checkpointing._build_sharded_state_dict_metadata): it selects the sharded-state-dict layout
# at load time (the SwiGLU fc1 as one key, gate and up halves each split by TP).
CONTENT_METADATA = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}


class CheckpointFormatError(ValueError):
    """A folder that is not a Megatron checkpoint this package reads (message printed as is)."""


# -- writing -----------------------------------------------------------------------------------

def common_state() -> dict:
    """The non-tensor part of the checkpoint (Megatron's 'common_state' object). No `args`:
    Megatron compares a checkpoint's args with the run's only when they are present."""
    return {"checkpoint_version": CHECKPOINT_VERSION, "iteration": 0,
            "num_floating_point_operations_so_far": 0, "content_metadata": dict(CONTENT_METADATA)}


def _object_bytes(obj) -> bytes:
    """A ShardedObject as Megatron's torch_dist strategy stores it: torch.save([data])."""
    buf = io.BytesIO()
    torch.save([obj], buf)
    return buf.getvalue()


def _planner_class():
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                       TensorProperties)
    from torch.distributed.checkpoint.planner import (SavePlan, TensorWriteData, WriteItem,
                                                      WriteItemType)

    class StreamingPlanner(DefaultSavePlanner):
        """Plans every chunk from its description; makes each tensor when it is written."""

        def __init__(self, tensors: list[MegatronTensor], dtype: torch.dtype,
                     objects: dict[str, bytes], produce: Callable[[MegatronTensor], torch.Tensor],
                     done: Callable[[torch.Tensor], None] | None):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self._tensors = {(t.key, t.offsets): t for t in tensors}
            self._order = tensors
            self._dtype = dtype
            self._objects = objects
            self._produce = produce
            self._done = done
            self._held = threading.local()

        def create_local_plan(self):
            items = [WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO)
                     for key in self._objects]
            for t in self._order:
                items.append(WriteItem(
                    index=MetadataIndex(t.key, torch.Size(t.offsets)), type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=torch.Size(t.offsets),
                                                   sizes=torch.Size(t.chunk_shape)),
                        properties=TensorProperties(dtype=self._dtype),
                        size=torch.Size(t.global_shape))))
            self.plan = SavePlan(items)
            return self.plan

        def resolve_data(self, write_item):
            self.release()
            if write_item.type == WriteItemType.BYTE_IO:
                return io.BytesIO(self._objects[write_item.index.fqn])
            spec = self._tensors[(write_item.index.fqn, tuple(write_item.index.offset))]
            tensor = self._produce(spec).reshape(spec.chunk_shape)
            self._held.tensor = tensor
            return tensor

        def release(self) -> None:
            """The writer is done with the chunk this thread handed out last when it asks for
            the next one (it keeps a reference, not the memory): hand it back to the producer,
            or free it."""
            tensor = getattr(self._held, "tensor", None)
            if tensor is not None:
                self._held.tensor = None
                if self._done is not None:
                    self._done(tensor)
                elif tensor.untyped_storage().resizable():
                    tensor.untyped_storage().resize_(0)

    return StreamingPlanner


def write_dist_checkpoint(folder: Path, tensors: list[MegatronTensor], dtype: torch.dtype,
                          produce: Callable[[MegatronTensor], torch.Tensor],
                          num_layers: int, workers: int = 1,
                          done: Callable[[torch.Tensor], None] | None = None,
                          moe: bool = False) -> None:
    """A release checkpoint under `folder` (which must not exist yet, or be empty).

    `produce(spec)` returns a contiguous tensor holding that chunk (its storage exactly the
    chunk); once written, it goes to `done(tensor)` (the producer may reuse its memory), or,
    without `done`, its storage is freed."""
    from torch.distributed import checkpoint as dcp
    from torch.utils.serialization import config as serialization_config

    from .layout import extra_state_keys

    target = folder / RELEASE
    target.mkdir(parents=True)
    objects = {key: _object_bytes(None) for key in extra_state_keys(num_layers, moe)}
    objects["common_state/shard_0_1"] = _object_bytes(common_state())
    planner = _planner_class()(tensors, dtype, objects, produce, done)
    writer = dcp.FileSystemWriter(str(target), single_file_per_rank=True, sync_files=True,
                                  thread_count=workers, per_thread_copy_ahead=0)
    # torch.save's zip records carry a CRC32 of each tensor by default: computed in one thread
    # it ran at a quarter of the disk's write speed here (211 vs 927 MB/s for a 512 MB tensor);
    # readers do not check it.
    crc = serialization_config.save.compute_crc32
    serialization_config.save.compute_crc32 = False
    try:
        dcp.save({}, storage_writer=writer, planner=planner, no_dist=True)
    finally:
        serialization_config.save.compute_crc32 = crc
        planner.release()
    (target / CONFIG).write_text(json.dumps({"sharded_backend": "torch_dist",
                                             "sharded_backend_version": 1}))
    (folder / TRACKER).write_text(RELEASE)


# -- reading -----------------------------------------------------------------------------------

def iteration_dir(root: Path) -> Path:
    """The distributed checkpoint a folder points at: its tracker's iteration (or release), or
    the folder itself when it is one (iter_0000020/, release/)."""
    if (root / CONFIG).is_file():
        return root
    tracker = root / TRACKER
    if not tracker.is_file():
        raise CheckpointFormatError(f"{root} is not a Megatron checkpoint (no {TRACKER} and no "
                                    f"{CONFIG})")
    text = tracker.read_text().strip()
    name = RELEASE if text == RELEASE else f"iter_{int(text):07d}" if text.isdigit() else None
    if name is None or not (root / name / CONFIG).is_file():
        raise CheckpointFormatError(f"{root}: {TRACKER} says {text!r} but no distributed "
                                    f"checkpoint is there (only --ckpt-format torch_dist is read)")
    return root / name


class DistCheckpointReader:
    """Reads chunks of a Megatron distributed checkpoint saved at any TP/PP layout.

    Megatron's own load strategy does the resharding: each request is a ShardedTensor of the
    global tensor (a whole tensor, or one layer of a stacked one), filled from whatever chunks
    the checkpoint holds. Needs a torch.distributed process group (one process is enough)."""

    def __init__(self, folder: Path):
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.strategies.torch import \
            TorchDistLoadShardedStrategy

        self.folder = folder
        self.common = dist_checkpointing.load_common_state_dict(str(folder))
        self.metadata = {key: (tuple(t.global_shape), t.dtype) for key, t in
                         dist_checkpointing.load_tensors_metadata(str(folder)).items()}
        self._strategy = TorchDistLoadShardedStrategy(cache_metadata=True)

    def read(self, requests: list[tuple[str, int | None]]) -> list[torch.Tensor]:
        """(key, layer) -> the tensor (layer None: the whole global tensor)."""
        from megatron.core.dist_checkpointing import ShardedTensor

        state = {}
        for i, (key, layer) in enumerate(requests):
            shape, dtype = self.metadata[key]
            if layer is None:
                state[str(i)] = ShardedTensor.from_rank_offsets(
                    key, torch.empty(shape, dtype=dtype), replica_id=0)
            else:  # one layer as a [1, ...] slice of the stacked tensor (no prepended axis:
                # Megatron's grid conversion for those needs every layer's shard in the world)
                state[str(i)] = ShardedTensor.from_rank_offsets(
                    key, torch.empty((1, *shape[1:]), dtype=dtype), (0, layer, shape[0]),
                    replica_id=0)
        loaded = self._strategy.load(state, Path(self.folder))
        return [loaded[str(i)] if layer is None else loaded[str(i)][0]
                for i, (_, layer) in enumerate(requests)]

    def close(self) -> None:
        from megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import \
            CachedMetadataFileSystemReader

        CachedMetadataFileSystemReader.clear_metadata_cache()


def is_extra_state(key: str) -> bool:
    """A module's `_extra_state` (Transformer Engine's fp8 metadata, None elsewhere), not a
    weight: `x._extra_state`, TE's grouped `x._extra_state1`, or a prefix-mapped norm's
    `linear_qkv.layer_norm__extra_state`."""
    return re.search(r"_extra_state\d*$", key) is not None


def load_weights(model, root: Path) -> list[str]:
    """Load a checkpoint's weights into a built GPTModel (this process's TP/PP part of it), as
    megatron.training's load_checkpoint does for the model: the checkpoint's content metadata
    picks the sharded-state-dict layout, Megatron's loader reshards. For tests and checks; a
    training run loads through --pretrained-checkpoint / --load.

    An `_extra_state` the model asks for and the checkpoint lacks (an import made before it
    wrote the final norm's, or a module it does not know) is left as the model built it, and
    its state-dict key returned; a missing weight is refused (CheckpointFormatError, every key
    named; the model, partly loaded then, is to be discarded)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    folder = iteration_dir(Path(root))
    common = dist_checkpointing.load_common_state_dict(str(folder))
    sharded = {"model": model.sharded_state_dict(
        metadata=dict(common.get("content_metadata") or {}))}
    # RETURN_UNEXPECTED: what the model asks for and the checkpoint lacks is dropped from the
    # request and returned (Megatron's "unexpected" keys), not raised inside DCP.
    state, _, absent = dist_checkpointing.load(sharded, str(folder),
                                               strict=StrictHandling.RETURN_UNEXPECTED)
    _refuse_weights(root, "lacks", absent)
    result = model.load_state_dict(state["model"], strict=False)
    _refuse_weights(root, "left unset", result.missing_keys)
    _refuse_weights(root, "holds what the model does not have", result.unexpected_keys)
    dropped = sorted(result.missing_keys)   # the absent ones, by the model's own names
    if dropped:
        log.info("%s: no %s in the checkpoint; left as built", root, ", ".join(dropped))
    return dropped


def _refuse_weights(root, what: str, keys) -> None:
    """Refused after the load (Megatron's loader fills the model's tensors in place): the
    model is then partly loaded and is to be discarded."""
    weights = sorted(key for key in keys if not is_extra_state(key))
    if weights:
        raise CheckpointFormatError(f"{root} {what}: {', '.join(weights)} (a checkpoint of "
                                    "another model or layout)")
