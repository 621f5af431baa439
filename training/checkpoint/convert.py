"""import_checkpoint (Hugging Face -> Megatron) and export_checkpoint (Megatron -> Hugging Face).

Both stream: the import reads each Megatron chunk's rows straight from the safetensors files
into that chunk's buffer and hands it to the writer, which frees it before the next one (the
largest chunk, the embedding or output layer, is the most held at once); the export reads one
layer of the Megatron checkpoint at a time and writes bounded safetensors shards. Outputs go
through staging.Staging (a temporary sibling, renamed at the end).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import hf, layout, record
from .layout import Architecture, ArchitectureError
from .staging import Staging

DEFAULT_SHARD_BYTES = 2 << 30
# The import writes no chunk larger than this (bigger tensors go in row ranges): what it holds
# at once does not grow with the vocabulary or the model's width.
MAX_CHUNK_BYTES = 256 << 20


class ConversionError(ValueError):
    """Bad input for a conversion (message printed as is; the CLI exits 2)."""


class Progress:
    """A rich progress bar in bytes on stderr (a terminal), else one line every 10 s."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.start = self.last = time.perf_counter()
        self.enabled = enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TimeRemainingColumn, TransferSpeedColumn)

            self.bar = Progress(TextColumn(label), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True))
            self.task = self.bar.add_task(label, total=self.total)
            self.bar.start()

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif self.enabled and time.perf_counter() - self.last >= 10:
            self.last = time.perf_counter()
            print(f"{self.label}: {100 * self.done / self.total:5.1f}% of "
                  f"{self.total / 2**30:.2f} GiB", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@dataclass
class Result:
    out: Path
    tensors: int
    nbytes: int
    seconds: float
    detail: dict


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("megatron-core", "torch", "safetensors", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


# -- import ------------------------------------------------------------------------------------

def _resolve(source: str, preset_name: str | None, presets: dict | None):
    """(folder, config, presets): the preset name checked, a Hub id's config.json fetched and
    checked (_check_config) before any weight."""
    from training.launch.presets import PRESETS

    presets = PRESETS if presets is None else presets
    if preset_name is not None and preset_name not in presets:
        raise ConversionError(f"unknown preset {preset_name!r}: use one of {', '.join(presets)}")
    folder = hf.resolve_source(source, check=_check_config)
    return folder, hf.load_config(folder), presets


def plan_import(source: str, preset_name: str | None = None, presets: dict | None = None):
    """Everything the import checks before writing: (folder, config, arch, preset or None,
    files, dtype). A Hub id's config.json is fetched and checked before any weight."""
    folder, config, presets = _resolve(source, preset_name, presets)
    return _plan_folder(folder, config, preset_name, presets)


def _plan_folder(folder: Path, config: dict, preset_name: str | None, presets: dict):
    """plan_import's checks of a resolved folder (a family of layout's row tables)."""
    arch = Architecture.from_hf_config(config)
    preset = (layout.match_preset(arch, presets, preset_name) if preset_name is not None
              else layout.matching_preset(arch, presets))
    files = hf.SafetensorsFolder(folder)
    # a folder whose experts are fused (transformers 5's save_original_format=False) is read,
    # and exported back, in that form
    if arch.moe and f"model.layers.0.{layout.FUSED_EXPERTS[1]}" in files.entries:
        arch = dataclasses.replace(arch, fused_experts=True)
    expected = layout.hf_shapes(arch)
    missing = [n for n in expected if n not in files.entries]
    if missing:
        raise ConversionError(f"{folder} lacks {len(missing)} tensor(s) its config implies, "
                              f"e.g. {missing[0]}")
    wrong = [f"{n} {files.entries[n].shape} (config implies {s})" for n, s in expected.items()
             if files.entries[n].shape != s]
    if wrong:
        raise ConversionError(f"{folder}: tensor shapes do not fit config.json: {wrong[0]}")
    extra = [n for n in files.entries
             if n not in expected and not n.endswith("rotary_emb.inv_freq")]
    if extra:
        raise ConversionError(f"{folder} holds tensors its config ({arch.family}) does not "
                              f"imply, e.g. {extra[0]}: not converted")
    dtypes = {files.entries[n].dtype for n in expected}
    if len(dtypes) != 1:
        raise ConversionError(f"{folder} mixes dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                              "the import keeps one dtype per checkpoint")
    return folder, config, arch, preset, files, dtypes.pop()


def _check_config(config: dict) -> None:
    """A Hub id's config.json, before any weight is fetched: a family this converts."""
    from . import gpt_oss_files

    if gpt_oss_files.is_gpt_oss(config):
        try:
            gpt_oss_files.check_config(config)
        except gpt_oss_files.GptOssFolderError as err:
            raise ConversionError(str(err)) from None
    else:
        Architecture.from_hf_config(config)


class ChunkBuffer:
    """Where the import puts each chunk. One writer thread writes one chunk at a time, so every
    chunk lives in the same anonymous mapping, the size of the largest (huge pages where the
    kernel gives them): no allocation, page faults or zeroing per chunk. Each chunk is a tensor
    over the mapping's start whose storage is exactly the chunk (torch.frombuffer), so the
    writer saves only the chunk. More writer threads: a fresh allocation per chunk."""

    def __init__(self, largest_bytes: int, shared: bool):
        import mmap

        self.arena = None
        self.busy = False
        if shared:
            self.arena = mmap.mmap(-1, largest_bytes)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self.arena.madvise(mmap.MADV_HUGEPAGE)

    def take(self, shape: tuple[int, ...], dtype):
        import torch

        if self.arena is None:
            return torch.empty(shape, dtype=dtype)
        if self.busy:
            raise RuntimeError("the checkpoint writer asked for a chunk before it had written "
                               "the previous one")
        self.busy = True
        numel = 1
        for d in shape:
            numel *= d
        view = memoryview(self.arena)[:numel * dtype.itemsize]
        return torch.frombuffer(view, dtype=dtype).view(shape)

    def done(self, tensor) -> None:
        self.busy = False


def import_checkpoint(source: str, out: Path, preset_name: str | None = None,
                      presets: dict | None = None, workers: int = 1, progress: bool = True,
                      max_chunk_bytes: int = MAX_CHUNK_BYTES) -> Result:
    import torch

    from .megatron import write_dist_checkpoint

    start = time.perf_counter()
    from training.launch.model_config import shape_name

    from . import gpt_oss_files

    folder, config, presets = _resolve(source, preset_name, presets)
    if gpt_oss_files.is_gpt_oss(config):   # its experts' views: converted a layer at a time
        try:
            return gpt_oss_files.import_folder(folder, config, out, preset_name, presets,
                                               progress, max_chunk_bytes, _versions(), Progress,
                                               Result)
        except gpt_oss_files.GptOssFolderError as err:
            raise ConversionError(str(err)) from None
    folder, config, arch, preset, files, dtype = _plan_folder(folder, config, preset_name,
                                                              presets)
    # a published shape keeps its preset's name (MODEL_SIZE); any other its folder's (or
    # Hub repository's) name
    name = preset.name if preset is not None else shape_name(Path(folder))
    tensors = layout.split_rows(layout.megatron_tensors(arch), max_chunk_bytes, dtype.itemsize)
    nbytes = sum(t.numel() for t in tensors) * dtype.itemsize
    buffer = ChunkBuffer(max(t.numel() for t in tensors) * dtype.itemsize, shared=workers == 1)
    bar = None
    try:
        with Staging(out, nbytes) as stage:
            bar = Progress("import", nbytes, progress)
            following = {id(a): b for a, b in zip(tensors, tensors[1:])}

            def produce(spec: layout.MegatronTensor) -> torch.Tensor:
                chunk = buffer.take((spec.rows, *spec.shape[1:]), dtype)
                rows, row = layout.rows_view(chunk), 0
                for block in spec.blocks:
                    files.read_rows(block.hf_name, block.row, block.rows,
                                    rows[row:row + block.rows])
                    row += block.rows
                # the disk reads the next chunk while the writer writes this one
                upcoming = following.get(id(spec))
                for block in upcoming.blocks if upcoming is not None else ():
                    files.prefetch(block.hf_name, block.row, block.rows)
                bar.advance(chunk.nbytes)
                return chunk

            write_dist_checkpoint(stage.path, tensors, dtype, produce, arch.num_layers, workers,
                                  done=buffer.done if workers == 1 else None, moe=arch.moe)
            side = hf.copy_side_files(folder, stage.path / record.SIDE_DIR)
            record.write_record(stage.path, name=name, arch=arch, hf_config=config,
                                source=str(folder.absolute()),
                                dtype=str(dtype).removeprefix("torch."),
                                tensors=len(tensors), nbytes=nbytes, side_files=side,
                                versions=_versions())
            stage.commit()
    finally:
        files.close()
        if bar is not None:
            bar.close()
    return Result(Path(out), len(tensors), nbytes, time.perf_counter() - start,
                  {"name": name, "family": arch.family, "num_layers": arch.num_layers,
                   "dtype": str(dtype)})


# -- export ------------------------------------------------------------------------------------

@contextlib.contextmanager
def single_process_group():
    """Megatron's dist-checkpoint loader asks torch.distributed for ranks: one gloo process."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _config_source(root: Path, args, hf_config: Path | None):
    """The Hugging Face config, the folder of its side files, and the import's Architecture
    (None without a record) of what an export writes back:
    --hf-config; else the checkpoint's own import record; else the record of the checkpoint the
    run started from (its saved --pretrained-checkpoint); else none."""
    candidates = []
    if hf_config is not None:
        candidates.append(Path(hf_config))
    candidates.append(root)
    pretrained = getattr(args, "pretrained_checkpoint", None) if args is not None else None
    if pretrained:
        candidates.append(Path(pretrained))
    for i, path in enumerate(candidates):
        rec = record.read_record(path) if path.is_dir() else None
        if rec is not None:
            return rec["hf_config"], path / record.SIDE_DIR, rec["architecture"]
        if i == 0 and hf_config is not None:
            config_file = path if path.is_file() else path / hf.CONFIG
            if not config_file.is_file():
                raise ConversionError(f"--hf-config {hf_config}: no config.json there")
            return (hf.read_object(config_file, "Hugging Face config.json"), config_file.parent,
                    None)
    return None, None, None


def architecture_from_args(args) -> Architecture:
    """The architecture the Megatron arguments a checkpoint saved describe (vocab_size left as
    the padded size: the caller fixes it)."""
    from training.run_description import Model

    if getattr(args, "quick_geglu", False) or getattr(args, "softmax_type", "vanilla") != "vanilla":
        raise ConversionError("the checkpoint is a gpt-oss model and no Hugging Face config was "
                              "found beside it (a run started from `python -m "
                              "training.checkpoint import` finds the import's): give "
                              "--hf-config with a gpt-oss config.json of its shape")
    if getattr(args, "normalization", None) != "RMSNorm" or not getattr(args, "swiglu", False) \
            or getattr(args, "position_embedding_type", None) != "rope":
        raise ConversionError("the checkpoint's model is not a Llama-architecture decoder "
                              "(RMSNorm, SwiGLU, RoPE): not exported")
    if getattr(args, "add_bias_linear", False):
        raise ConversionError("the checkpoint's linears carry biases (--add-bias-linear): "
                              "not exported")
    if getattr(args, "window_size", None) is not None:
        raise ConversionError(f"the checkpoint's attention is windowed (--window-size "
                              f"{args.window_size}): the Hugging Face configs this writes "
                              "(Llama, Qwen, Mixtral) would drop the window: not exported")
    return Architecture.from_model(Model.from_megatron_args(args))


def _describe(root: Path, common: dict, hf_config: Path | None, source: tuple | None = None
              ) -> tuple[Architecture, dict, Path | None]:
    """source: _config_source's answer where the caller has it already."""
    from training.launch.presets import PRESETS

    args = common.get("args")
    config, side, imported = source or _config_source(root, args, hf_config)
    if config is not None:   # an import's experts go back in the form they came in
        fused = imported is not None and imported.fused_experts
        return (dataclasses.replace(Architecture.from_hf_config(config), fused_experts=fused),
                config, side)
    if args is None:
        raise ConversionError(f"{root} records neither its model (no saved arguments) nor an "
                              "import: pass --hf-config with the Hugging Face folder it came from")
    arch = architecture_from_args(args)
    # The true vocabulary: Megatron pads it; a preset of the same shape knows it.
    for preset in PRESETS.values():
        base = Architecture.from_model(preset)
        if not base.differences(arch, ignore=("num_layers", "vocab_size", "family",
                                              "architecture", "max_position_embeddings",
                                              "fused_experts")) \
                and preset.vocab_size <= arch.vocab_size:
            arch = dataclasses.replace(arch, vocab_size=preset.vocab_size)
            break
    else:
        raise ConversionError(f"{root}: no preset has this model's shape, so its true vocabulary "
                              "is unknown: pass --hf-config with the Hugging Face config")
    return arch, {}, None


def _check_fits(arch: Architecture, metadata: dict) -> None:
    shapes = {key: shape for key, (shape, _) in metadata.items()}
    expected = {t.key: t.global_shape for t in layout.megatron_tensors(arch)}
    for key in expected:
        if key not in shapes:
            raise ConversionError(f"the checkpoint has no {key}: not a {arch.family} GPTModel "
                                  "of this config")
    if arch.tied_embeddings and layout.OUTPUT in shapes:
        raise ConversionError("the config ties the embeddings, and the checkpoint has an "
                              f"output layer of its own ({layout.OUTPUT}): pass --hf-config "
                              "with an untied config")
    for key, shape in expected.items():
        stored = shapes[key]
        if key in (layout.EMBEDDING, layout.OUTPUT):   # Megatron pads the vocabulary
            ok = stored[1:] == shape[1:] and stored[0] >= shape[0]
        else:
            ok = stored == shape
        if not ok:
            raise ConversionError(f"the config does not fit the checkpoint: {key} is "
                                  f"{tuple(stored)}, the config implies {tuple(shape)}")


def export_checkpoint(ckpt: Path, out: Path, hf_config: Path | None = None,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: bool = True) -> Result:
    import torch
    from . import safetensors_file
    from .megatron import DistCheckpointReader, iteration_dir

    start = time.perf_counter()
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        raise ConversionError(f"no folder {ckpt}: give a Megatron checkpoint folder (the one "
                              "holding latest_checkpointed_iteration.txt)")
    folder = iteration_dir(ckpt)
    bar = None
    with single_process_group():
        reader = DistCheckpointReader(folder)
        try:
            root = ckpt if folder != ckpt else ckpt.parent
            source = _config_source(root, reader.common.get("args"), hf_config)
            found, found_side, _ = source
            if found is not None and found.get("model_type") == "gpt_oss":
                from . import gpt_oss_files

                try:
                    count, nbytes, shards = gpt_oss_files.export_reader(
                        reader, found, found_side, out, max_shard_bytes, progress, Progress)
                except gpt_oss_files.GptOssFolderError as err:
                    raise ConversionError(str(err)) from None
                return Result(Path(out), count, nbytes, time.perf_counter() - start,
                              {"source": str(folder), "shards": shards,
                               "note": "gpt-oss experts written in "
                                       f"{str(reader.metadata[layout.EMBEDDING][1])[6:]}, "
                                       "not re-quantized to MXFP4"})
            arch, config, side_dir = _describe(root, reader.common, hf_config, source)
            _check_fits(arch, reader.metadata)
            dtype = reader.metadata[layout.EMBEDDING][1]
            shapes = layout.hf_shapes(arch)
            nbytes = sum(_numel(s) for s in shapes.values()) * dtype.itemsize
            # hf name -> [(megatron chunk, its first row for this block, block)]
            sources: dict[str, list] = {}
            for spec in layout.megatron_tensors(arch):
                row = 0
                for block in spec.blocks:
                    sources.setdefault(block.hf_name, []).append((spec, row, block))
                    row += block.rows
            groups = hf.shard_groups({n: _numel(s) * dtype.itemsize for n, s in shapes.items()},
                                     max_shard_bytes)
            with Staging(out, nbytes) as stage:
                bar = Progress("export", nbytes, progress)
                chunks = _ChunkCache(reader, sources)

                def produce(name: str) -> torch.Tensor:
                    tensor = torch.empty(shapes[name], dtype=dtype)
                    for spec, row, block in sources[name]:
                        chunk = layout.rows_view(chunks.get(spec))
                        layout.rows_view(tensor)[block.row:block.row + block.rows].copy_(
                            chunk[row:row + block.rows])
                    chunks.done(name)
                    bar.advance(tensor.nbytes)
                    return tensor

                weight_map = {}
                for index, names in enumerate(groups):
                    file_name = hf.shard_file_name(index, len(groups))
                    safetensors_file.write(stage.path / file_name,
                                           [(n, hf.dtype_name(dtype), shapes[n]) for n in names],
                                           produce, metadata={"format": "pt"})
                    weight_map.update({name: file_name for name in names})
                if len(groups) > 1:
                    hf.write_index(stage.path, weight_map, nbytes)
                _write_side_files(stage.path, side_dir, config, arch, dtype)
                stage.commit()
        finally:
            reader.close()
            if bar is not None:
                bar.close()
    return Result(Path(out), len(shapes), nbytes, time.perf_counter() - start,
                  {"source": str(folder), "shards": len(groups)})


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _ChunkCache:
    """The Megatron chunks the export is copying from: each read when a Hugging Face tensor
    first needs it and dropped after the last one that does, so one Megatron tensor (one
    layer's slice of it) and the Hugging Face tensor being filled are what is held, not a layer
    or a shard. `sources`: each Hugging Face name's chunks, in the order they are written."""

    def __init__(self, reader, sources: dict[str, list]):
        self.reader = reader
        self.held: dict[tuple, object] = {}
        self.last: dict[str, list[tuple]] = {}
        owner: dict[tuple, str] = {}
        for name, parts in sources.items():
            for spec, _row, _block in parts:
                owner[(spec.key, spec.layer)] = name
        for key, name in owner.items():
            self.last.setdefault(name, []).append(key)

    def get(self, spec: layout.MegatronTensor):
        key = (spec.key, spec.layer)
        if key not in self.held:
            self.held[key] = self.reader.read([key])[0]
        return self.held[key]

    def done(self, name: str) -> None:
        for key in self.last.get(name, ()):
            self.held.pop(key, None)


def _write_side_files(folder: Path, side_dir: Path | None, config: dict, arch: Architecture,
                      dtype) -> None:
    if side_dir is not None and side_dir.is_dir():
        hf.copy_side_files(side_dir, folder)
    merged = {k: v for k, v in config.items() if k != "rope_parameters"}
    merged.update(arch.hf_config_fields())
    merged["torch_dtype"] = str(dtype).removeprefix("torch.")
    if "dtype" in merged:
        merged["dtype"] = merged["torch_dtype"]
    hf.write_config(folder, merged)

