"""The resolved configuration the advisor reasons about, read from a manifest.

Everything here was decided by the launcher (training/launch/) and written to the manifest;
nothing is re-decided. `with_changes` gives the same run with some toggles changed (a
lever applied, or the shape the user asks for), keeping the layout arithmetic consistent.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from training.platforms import PLATFORMS, Platform, platform_for_device_name

from .inputs import BadInput

# Megatron pads the vocabulary to a multiple of this times TP (--make-vocab-size-divisible-by).
VOCAB_DIVISIBLE_BY = 128


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@dataclass(frozen=True)
class RunConfig:
    family: str
    model: str
    num_layers: int
    preset_layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    vocab: int
    seq: int
    mbs: int
    global_batch: int
    nnodes: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    sp: bool
    fsdp: bool
    dist_opt: bool
    grad_bf16: bool
    grad_accum_fusion: bool
    ce_fusion: bool
    ce_chunk_mem: int | None   # Liger fused CE chunk_mem_const; None: the manifest predates it
    recompute: str             # none | selective | full
    backend: str               # native | local | transformer_engine
    kernels: str               # liger | torch (native backend)
    precision: str
    deterministic: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    data_path: str | None
    num_workers: int
    num_experts: int | None
    platform: str | None       # training.platforms key
    platform_source: str
    te_available: bool
    apex_available: bool
    liger_available: bool

    # -- derived -------------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return max(self.world // (self.tp * self.pp * self.cp), 1)

    @property
    def microbatches(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (grad accumulation)."""
        return max(self.global_batch // (self.mbs * self.dp), 1)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        return self.groups * self.head_dim

    @property
    def padded_vocab(self) -> int:
        multiple = VOCAB_DIVISIBLE_BY * self.tp
        return int(math.ceil(self.vocab / multiple) * multiple)

    @property
    def flce(self) -> bool:
        """The native backend's fused linear cross-entropy runs (never materialises logits)."""
        return self.backend == "native" and self.ce_fusion and self.tp == 1 and self.cp == 1

    @property
    def moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def platform_info(self) -> Platform | None:
        return PLATFORMS.get(self.platform) if self.platform else None

    @property
    def device_gib(self) -> float | None:
        info = self.platform_info
        return float(info.memory_gib) if info else None

    @property
    def fused_adam(self) -> bool:
        """Megatron's optimizer is a fused Adam: TE's or apex's, or the native backend's
        torch AdamW(fused=True). Otherwise torch's multi-tensor AdamW runs."""
        return self.backend == "native" or self.te_available or self.apex_available

    @property
    def script(self) -> str:
        return {"llama3": "examples/llama/train_llama3.sh",
                "llama2": "examples/llama/train_llama2.sh"}.get(self.family,
                                                                 f"examples/*/train_{self.family}.sh")

    def with_changes(self, **changes: Any) -> "RunConfig":
        if "tp" in changes and "sp" not in changes:
            changes["sp"] = changes["tp"] > 1 and self.backend != "local"
        return dataclasses.replace(self, **changes)

    def shape_key(self) -> dict[str, Any]:
        """The run's shape in the levers.json `shape` vocabulary."""
        return {"model": self.model, "num_layers": self.num_layers, "seq_length": self.seq,
                "mbs": self.mbs, "global_batch": self.global_batch, "gpus": self.world,
                "tp": self.tp, "pp": self.pp, "dp": self.dp, "precision": self.precision,
                "backend": self.backend}


def _platform(manifest: dict, override: str | None) -> tuple[str | None, str]:
    if override:
        if override not in PLATFORMS:
            raise BadInput(f"--platform {override!r}: use one of {', '.join(PLATFORMS)}")
        return override, f"--platform {override}"
    caps = manifest.get("capabilities") or {}
    if caps.get("platform") in PLATFORMS:
        return caps["platform"], f"manifest capabilities.platform ({caps.get('source')})"
    device = ((manifest.get("run") or {}).get("versions") or {}).get("device")
    if device:
        found = platform_for_device_name(device)
        if found:
            return found.name, f"manifest run.versions.device ({device})"
    return None, "unknown (no GPU in the manifest: pass --platform, e.g. --platform h200)"


def _preset_layers(name: str, fallback: int) -> int:
    from training.launch.presets import PRESETS

    preset = PRESETS.get(name)
    return preset.num_layers if preset else fallback


def from_manifest(manifest: dict, platform: str | None = None) -> RunConfig:
    model, layout, values = manifest["model"], manifest["layout"], manifest["values"]
    caps = manifest.get("capabilities") or {}
    try:
        name, plat_source = _platform(manifest, platform)
        config = RunConfig(
            family=str(manifest.get("family") or "llama3"),
            model=str(model["name"]),
            num_layers=int(model.get("num_layers") or values["NUM_LAYERS"]),
            preset_layers=_preset_layers(str(model["name"]), int(model["num_layers"])),
            hidden=int(model["hidden_size"]),
            ffn=int(model["ffn_hidden_size"]),
            heads=int(model["num_attention_heads"]),
            groups=int(model.get("num_query_groups") or model["num_attention_heads"]),
            vocab=int(model["vocab_size"]),
            seq=int(model.get("seq_length") or values["SEQ_LENGTH"]),
            mbs=int(layout["mbs"]),
            global_batch=int(layout["global_batch"]),
            nnodes=int(layout.get("nnodes") or 1),
            gpus_per_node=int(layout.get("gpus_per_node") or 1),
            tp=int(layout["tp"]), pp=int(layout["pp"]), cp=int(layout["cp"]),
            sp=_bool(values.get("SEQUENCE_PARALLEL")),
            fsdp=_bool(layout.get("fsdp", values.get("FSDP"))),
            dist_opt=_bool(layout.get("distributed_optimizer", values.get("DISTRIBUTED_OPTIMIZER"))),
            grad_bf16=_bool(values.get("GRAD_REDUCE_IN_BF16")),
            grad_accum_fusion=_bool(values.get("GRADIENT_ACCUMULATION_FUSION")),
            ce_fusion=_bool(values.get("CROSS_ENTROPY_LOSS_FUSION")),
            ce_chunk_mem=(int(values["CE_CHUNK_MEM"]) if values.get("CE_CHUNK_MEM") is not None
                          else None),
            recompute=str(values.get("RECOMPUTE") or "none"),
            backend=str(manifest.get("backend") or values.get("TRANSFORMER_IMPL")),
            kernels=str(values.get("NATIVE_KERNELS") or "torch"),
            precision=str(manifest.get("precision") or values.get("PRECISION") or "bf16"),
            deterministic=_bool(values.get("DETERMINISTIC")),
            overlap_grad_reduce=_bool(values.get("OVERLAP_GRAD_REDUCE")),
            overlap_param_gather=_bool(values.get("OVERLAP_PARAM_GATHER")),
            data_path=values.get("DATA_PATH"),
            num_workers=int(values.get("NUM_WORKERS") or 2),
            num_experts=model.get("num_experts") or None,
            platform=name, platform_source=plat_source,
            te_available=_bool(caps.get("transformer_engine")),
            apex_available=_bool(caps.get("apex_fused_wgrad")),
            liger_available=_bool(caps.get("liger")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise BadInput(f"the manifest lacks a field the advisor needs ({err}); "
                       "regenerate it with the launcher") from None
    if config.backend not in ("native", "local", "transformer_engine"):
        raise BadInput(f"the manifest's backend {config.backend!r} is not resolved "
                       "(native, local or transformer_engine expected)")
    return config
