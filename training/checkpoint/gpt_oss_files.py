"""gpt-oss through the CLI: a Hugging Face GptOss folder -> our Megatron checkpoint, and back.

The conversion is gpt_oss.py's table and views; this module streams it one layer at a time,
since the experts' views (gate and up interleaved in columns, x @ W) are not row blocks the
row-chunk machinery of convert.py can read in place: the import reads one layer's tensors,
applies the views and hands that layer's Megatron tensors to the writer; the export reads one
layer of the checkpoint and fills bounded safetensors shards. About one layer is held at once.

MXFP4 experts (the hub's openai/gpt-oss-20b and -120b): `mlp.experts.gate_up_proj_blocks`
[E, 2F, hidden/32, 16] uint8 with `..._scales` [E, 2F, hidden/32] uint8, the same for
down_proj ([E, hidden, F/32, 16]). Each byte holds two FP4 E2M1 values, the low nibble first;
each 16-byte block is 32 consecutive values of one row, scaled by 2**(scale - 127) (E8M0). The
dequantized [E, out, in] is transposed into transformers' x @ W orientation ([E, in, out]: the
gate_up_proj / down_proj of a bf16 folder). The import dequantizes them, one expert at a time,
into the checkpoint's dtype (the folder's other tensors'); the export writes bf16/fp32 experts
(gate_up_proj, down_proj): it does not quantize back to MXFP4.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from . import gpt_oss, hf, layout, record
from .layout import Architecture, Block, MegatronTensor
from .staging import Staging

ARCHITECTURE = "GptOssForCausalLM"
QUANTIZED = ("gate_up_proj", "down_proj")
BLOCK_VALUES = 32          # values per MXFP4 block (16 bytes)
SCALE_BIAS = 127           # E8M0: 2 ** (scale - 127)
# table key (one layer's, after "decoder.layers.N.") -> the distributed checkpoint's key, where
# the model's sharded state dict files it elsewhere (TE's fused norms; the experts' module)
DIST_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
              "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
              "mlp.experts.linear_fc1.weight": "mlp.experts.experts.linear_fc1.weight",
              "mlp.experts.linear_fc1.bias": "mlp.experts.experts.linear_fc1.bias",
              "mlp.experts.linear_fc2.weight": "mlp.experts.experts.linear_fc2.weight",
              "mlp.experts.linear_fc2.bias": "mlp.experts.experts.linear_fc2.bias"}


class GptOssFolderError(ValueError):
    """A gpt-oss folder or checkpoint this does not convert (message printed as is)."""


# -- MXFP4 -------------------------------------------------------------------------------------

def fp4_values(dtype=torch.float32) -> torch.Tensor:
    """The 16 FP4 E2M1 values by code: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0
    the mantissa; exponent 0 is subnormal (0 or 0.5)."""
    values = []
    for code in range(16):
        sign = -1.0 if code & 8 else 1.0
        exponent, mantissa = (code >> 1) & 3, code & 1
        magnitude = mantissa * 0.5 if exponent == 0 else 2.0 ** (exponent - 1) * (1 + mantissa / 2)
        values.append(sign * magnitude)
    return torch.tensor(values, dtype=dtype)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16
                     ) -> torch.Tensor:
    """[E, out, G, 16] uint8 blocks and [E, out, G] uint8 scales -> [E, G * 32, out] in `dtype`
    (transformers' x @ W orientation), one expert at a time."""
    if blocks.dim() != 4 or blocks.shape[-1] != BLOCK_VALUES // 2 \
            or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise GptOssFolderError(f"MXFP4 blocks {tuple(blocks.shape)} and scales "
                                f"{tuple(scales.shape)} do not pair ([E, out, G, 16] and "
                                "[E, out, G])")
    table = fp4_values()
    experts, rows, groups, _ = blocks.shape
    out = torch.empty((experts, groups * BLOCK_VALUES, rows), dtype=dtype)
    for e in range(experts):
        codes = torch.stack([blocks[e] & 0x0F, blocks[e] >> 4], dim=-1)   # low nibble first
        values = table[codes.long()].reshape(rows, groups, BLOCK_VALUES)
        values *= torch.exp2(scales[e].float() - SCALE_BIAS).unsqueeze(-1)
        out[e] = values.reshape(rows, groups * BLOCK_VALUES).T.to(dtype)
    return out


# -- the folder --------------------------------------------------------------------------------

def is_gpt_oss(config: dict) -> bool:
    return config.get("model_type") == "gpt_oss"


def check_config(config: dict) -> dict:
    """The shape of a gpt-oss config.json (gpt_oss._shape's), refusing in one line what our
    GptOssPreset cannot build: the launcher's own reading of it (MODEL_CONFIG), so what the
    import converts is what a launch of it builds."""
    from training.launch.model_config import ConfigError
    from training.moe.gpt_oss import shape_from_hf_config
    from training.records import HFConfig, RecordError, validate

    try:   # JSON's own types, finite numbers, top-k within the experts: as any config.json
        validate(config, HFConfig, "config.json")
        shape_from_hf_config(config, "import")
    except (RecordError, ConfigError) as err:
        raise GptOssFolderError(str(err)) from None
    return gpt_oss._shape(config)


def architecture(config: dict) -> Architecture:
    """The import record's shape (the launcher's pretrained_checkpoint guard compares it): the
    launcher's reading of the config (gpt-oss's biases on every linear are the preset's
    linear_bias, not Qwen2's qkv_bias field)."""
    from training.moe.gpt_oss import shape_from_hf_config

    return Architecture.from_model(shape_from_hf_config(config, "import"), family="gpt_oss",
                                   architecture=ARCHITECTURE)


def matching_preset(config: dict, presets: dict, name: str | None):
    """The GptOssPreset whose Hugging Face config this is (all layers, or `name`'s)."""
    from training.moe.gpt_oss import GptOssPreset

    mine = architecture(config)
    ignore = ("num_layers", "max_position_embeddings", "fused_experts")
    for preset in ([presets[name]] if name else presets.values()):
        if not isinstance(preset, GptOssPreset):
            if name:
                raise GptOssFolderError(f"--preset {name} is not a gpt-oss preset")
            continue
        theirs = dataclasses.replace(
            Architecture.from_model(preset, family="gpt_oss", architecture=ARCHITECTURE),
            ffn_hidden_size=mine.ffn_hidden_size)
        diff = mine.differences(theirs, ignore=ignore)
        if preset.sliding_window != config["sliding_window"]:
            diff.append(f"sliding_window: {config['sliding_window']} vs {preset.sliding_window}")
        if not diff and mine.num_layers == preset.num_layers:
            return preset
        if name:
            raise GptOssFolderError(f"the config does not match preset {name}: "
                                    f"{'; '.join(diff) or 'num_layers'}")
    return None


def _hf_layer_names(config: dict, layer: int, quantized: bool) -> dict[str, tuple]:
    """Layer `layer`'s Hugging Face tensors and shapes, the experts as stored: through
    gpt_oss.VIEWS (x @ W) in bf16/fp32, or as MXFP4 blocks and scales of the rows the table
    reads ([E, out, in] -> [E, out, in / 32, 16] and [E, out, in / 32])."""
    shapes = {}
    for _key, _shape, _blocks, reads in _layer_rows(config, layer):
        for name, read in reads.items():
            if quantized and name.endswith(QUANTIZED):
                experts, rows, width = read
                shapes[f"{name}_blocks"] = (experts, rows, width // BLOCK_VALUES,
                                            BLOCK_VALUES // 2)
                shapes[f"{name}_scales"] = (experts, rows, width // BLOCK_VALUES)
            else:
                shapes[name] = gpt_oss.stored_shape(name, read)
    return shapes


def _layer_rows(config: dict, layer: int) -> list:
    prefix = f"decoder.layers.{layer}."
    return [row for row in gpt_oss.table(config) if row[0].startswith(prefix)]


def _plan_folder(folder: Path, config: dict):
    """(files, dtype, quantized) after checking every tensor's name, shape and dtype."""
    shape = check_config(config)
    files = hf.SafetensorsFolder(folder)
    quantized = f"model.layers.0.mlp.experts.{QUANTIZED[0]}_blocks" in files.entries
    if quantized and any(shape[k] % BLOCK_VALUES for k in ("hidden", "ffn")):
        raise GptOssFolderError(f"{folder}: MXFP4 experts need hidden and intermediate sizes "
                                f"divisible by {BLOCK_VALUES}")
    expected = {layout.HF_EMBEDDING: (shape["vocab"], shape["hidden"])}
    for i in range(shape["layers"]):
        expected.update(_hf_layer_names(config, i, quantized))
    expected.update({layout.HF_NORM: (shape["hidden"],),
                     layout.HF_HEAD: (shape["vocab"], shape["hidden"])})
    missing = [n for n in expected if n not in files.entries]
    if missing:
        raise GptOssFolderError(f"{folder} lacks {len(missing)} tensor(s) its config implies"
                                f"{' (MXFP4 experts)' if quantized else ''}, e.g. {missing[0]}")
    for name, want in expected.items():
        if files.entries[name].shape != want:
            raise GptOssFolderError(f"{folder}: {name} is {files.entries[name].shape}, its "
                                    f"config implies {want}")
    extra = [n for n in files.entries if n not in expected]
    if extra:
        raise GptOssFolderError(f"{folder} holds tensors its config (gpt_oss) does not imply, "
                                f"e.g. {extra[0]}: not converted")
    packed = {n for n in expected if n.endswith(("_blocks", "_scales"))}
    wrong = [n for n in packed if files.entries[n].dtype != torch.uint8]
    if wrong:
        raise GptOssFolderError(f"{folder}: {wrong[0]} is {files.entries[wrong[0]].dtype}; "
                                "MXFP4 blocks and scales are uint8")
    dtypes = {files.entries[n].dtype for n in expected if n not in packed}
    if len(dtypes) != 1:
        raise GptOssFolderError(f"{folder} mixes dtypes ({', '.join(sorted(map(str, dtypes)))})"
                                "; the import keeps one dtype per checkpoint")
    return files, dtypes.pop(), quantized


def _read(files: hf.SafetensorsFolder, name: str) -> torch.Tensor:
    """A whole tensor of the folder."""
    entry = files.entries[name]
    out = torch.empty(entry.shape, dtype=entry.dtype)
    _read_into(files, name, 0, entry.shape[0], out)
    return out


def _read_into(files, name, row, rows, out) -> None:
    """First-axis rows [row, row + rows) of `name` into `out` (its 2-D rows: read_rows')."""
    entry = files.entries[name]
    per = layout.flat_rows(entry.shape) // entry.shape[0] if len(entry.shape) > 1 else 1
    files.read_rows(name, row * per, rows * per, out)


def _layer_tensors(files, config: dict, layer: int, quantized: bool, dtype) -> dict:
    """Layer `layer` as our table's tensors (the MXFP4 experts dequantized into `dtype`)."""
    hf_tensors = {}
    for name in _hf_layer_names(config, layer, quantized):
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            hf_tensors[base] = dequantize_mxfp4(_read(files, name), _read(files, base + "_scales"),
                                                dtype)
        else:
            hf_tensors[name] = _read(files, name)
    seen = {name: gpt_oss._view(name, t, 0) for name, t in hf_tensors.items()}
    return layout.table_to_megatron(_layer_rows(config, layer), seen)


def dist_key(table_key: str) -> str:
    """decoder.layers.N.X -> the distributed checkpoint's stacked key."""
    tail = table_key.split(".", 3)[3]
    return "decoder.layers." + DIST_NAMES.get(tail, tail)


def _specs(config: dict, max_chunk_bytes: int, itemsize: int) -> list[MegatronTensor]:
    n = gpt_oss._shape(config)
    vocab, h, layers = n["vocab"], n["hidden"], n["layers"]

    def one(key, shape, layer=None, hf_name=""):
        return MegatronTensor(key, shape, (Block(hf_name, 0, layout.flat_rows(shape)),), layer,
                              layers if layer is not None else None)

    out = [one(layout.EMBEDDING, (vocab, h), hf_name=layout.HF_EMBEDDING)]
    for i in range(layers):
        out += [one(dist_key(key), shape, i) for key, shape, _b, _r in _layer_rows(config, i)]
    out += [one(layout.FINAL_NORM, (h,), hf_name=layout.HF_NORM),
            one(layout.OUTPUT, (vocab, h), hf_name=layout.HF_HEAD)]
    # the vocabulary-sized tensors in bounded row ranges, read straight from the file
    return [piece for t in out for piece in
            (layout.split_rows([t], max_chunk_bytes, itemsize) if t.layer is None else [t])]


def import_folder(folder: Path, config: dict, out: Path, preset_name: str | None, presets: dict,
                  progress: bool, max_chunk_bytes: int, versions: dict, bar_class, result_class):
    from training.launch.model_config import shape_name

    from .megatron import write_dist_checkpoint

    start = time.perf_counter()
    files, dtype, quantized = _plan_folder(folder, config)
    try:
        preset = matching_preset(config, presets, preset_name)
        name = preset.name if preset is not None else shape_name(Path(folder))
        specs = _specs(config, max_chunk_bytes, dtype.itemsize)
        nbytes = sum(t.numel() for t in specs) * dtype.itemsize
        layers = gpt_oss._shape(config)["layers"]
        cache: dict = {}
        bar = None
        with Staging(out, nbytes) as stage:
            bar = bar_class("import", nbytes, progress)

            def produce(spec: MegatronTensor) -> torch.Tensor:
                if spec.layer is None:
                    chunk = torch.empty((spec.rows, *spec.shape[1:]), dtype=dtype)
                    _read_into(files, spec.blocks[0].hf_name, spec.row, spec.rows, chunk)
                else:
                    if cache.get("layer") != spec.layer:
                        cache.clear()
                        cache["layer"] = spec.layer
                        cache.update({dist_key(k): v for k, v in _layer_tensors(
                            files, config, spec.layer, quantized, dtype).items()})
                    chunk = cache.pop(spec.key)
                bar.advance(chunk.nbytes)
                return chunk

            try:
                write_dist_checkpoint(stage.path, specs, dtype, produce, layers, moe=True)
            finally:
                bar.close()
            side = hf.copy_side_files(folder, stage.path / record.SIDE_DIR)
            record.write_record(stage.path, name=name, arch=architecture(config),
                                hf_config=config, source=str(Path(folder).absolute()),
                                dtype=str(dtype).removeprefix("torch."), tensors=len(specs),
                                nbytes=nbytes, side_files=side, versions=versions)
            stage.commit()
    finally:
        files.close()
    return result_class(Path(out), len(specs), nbytes, time.perf_counter() - start,
                        {"name": name, "family": "gpt_oss", "num_layers": layers,
                         "dtype": str(dtype),
                         "mxfp4": "MXFP4 experts dequantized" if quantized else ""})


# -- export ------------------------------------------------------------------------------------

def _hf_order(config: dict) -> dict[str, tuple]:
    """Every Hugging Face tensor of a bf16 folder and its shape, in file order."""
    n = gpt_oss._shape(config)
    shapes = {layout.HF_EMBEDDING: (n["vocab"], n["hidden"])}
    for i in range(n["layers"]):
        shapes.update(_hf_layer_names(config, i, quantized=False))
    shapes[layout.HF_NORM] = (n["hidden"],)
    shapes[layout.HF_HEAD] = (n["vocab"], n["hidden"])
    return shapes


def export_reader(reader, config: dict, side_dir: Path | None, out: Path, max_shard_bytes: int,
                  progress: bool, bar_class) -> tuple[int, int, int]:
    """A gpt-oss checkpoint (reader: megatron.DistCheckpointReader) -> a Hugging Face folder with
    bf16/fp32 experts. (tensors, bytes, shards)"""
    from . import safetensors_file

    check_config(config)
    n = gpt_oss._shape(config)
    shapes = _hf_order(config)
    metadata = reader.metadata
    for spec in _specs(config, 1 << 62, 1):
        want = spec.global_shape
        got = metadata.get(spec.key, (None,))[0]
        vocab_ok = spec.key in (layout.EMBEDDING, layout.OUTPUT) and got is not None \
            and got[1:] == want[1:] and got[0] >= want[0]    # Megatron pads the vocabulary
        if got != want and not vocab_ok:
            raise GptOssFolderError(f"the config does not fit the checkpoint: {spec.key} is "
                                    f"{got if got is None else tuple(got)}, the config "
                                    f"implies {tuple(want)}")
    dtype = metadata[layout.EMBEDDING][1]
    nbytes = sum(math.prod(s) for s in shapes.values()) \
        * dtype.itemsize
    groups = hf.shard_groups({k: math.prod(s)
                              * dtype.itemsize for k, s in shapes.items()}, max_shard_bytes)
    whole = {layout.HF_EMBEDDING: layout.EMBEDDING, layout.HF_NORM: layout.FINAL_NORM,
             layout.HF_HEAD: layout.OUTPUT}
    cache: dict = {}

    def tensor(name: str) -> torch.Tensor:
        if name in whole:
            t = reader.read([(whole[name], None)])[0]
            return t[: n["vocab"]].contiguous() if name != layout.HF_NORM else t
        layer = int(name.split(".")[2])
        if cache.get("layer") != layer:
            cache.clear()
            rows = _layer_rows(config, layer)
            loaded = reader.read([(dist_key(key), layer) for key, *_ in rows])
            ours = {key: t for (key, *_), t in zip(rows, loaded)}
            cache.update({k: gpt_oss._view(k, t, 1)
                          for k, t in layout.table_to_hf(rows, ours).items()})
            cache["layer"] = layer
        return cache.pop(name)

    def produce(name: str) -> torch.Tensor:
        made = tensor(name).contiguous()
        bar.advance(made.nbytes)
        return made

    with Staging(out, nbytes) as stage:
        bar = bar_class("export", nbytes, progress)
        try:   # one layer held (its experts' views need it whole), written tensor by tensor
            weight_map = {}
            for index, names in enumerate(groups):
                file_name = hf.shard_file_name(index, len(groups))
                safetensors_file.write(stage.path / file_name,
                                       [(n, hf.dtype_name(dtype), shapes[n]) for n in names],
                                       produce, metadata={"format": "pt"})
                weight_map.update({name: file_name for name in names})
        finally:
            bar.close()
        if len(groups) > 1:
            hf.write_index(stage.path, weight_map, nbytes)
        if side_dir is not None and Path(side_dir).is_dir():
            hf.copy_side_files(Path(side_dir), stage.path)
        written = {k: v for k, v in config.items() if k != "quantization_config"}
        written["torch_dtype"] = str(dtype).removeprefix("torch.")
        if "dtype" in written:
            written["dtype"] = written["torch_dtype"]
        written.setdefault("architectures", [ARCHITECTURE])
        hf.write_config(stage.path, written)
        stage.commit()
    return len(shapes), nbytes, len(groups)
