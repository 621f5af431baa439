"""Environment variables the run needs, per vendor, kept in one place.

Each preset is shown in the startup table with its source: 'platform' when the launcher sets
it, 'env' when the user's environment already had a value (which always wins).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvPreset:
    name: str
    value: str
    vendors: tuple[str, ...]
    reason: str


PRESETS: tuple[EnvPreset, ...] = (
    EnvPreset("CUDA_DEVICE_MAX_CONNECTIONS", "1", ("nvidia", "amd"),
              "one hardware queue keeps TP/SP communication ordered before compute "
              "(Megatron expects it with sequence parallel); FSDP needs it unset"),
    EnvPreset("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", ("nvidia",),
              "fewer fragmentation OOMs at long sequence"),
    EnvPreset("TORCH_NCCL_HIGH_PRIORITY", "1", ("nvidia", "amd"),
              "NCCL/RCCL streams at high priority so overlapped collectives are not starved"),
    EnvPreset("HSA_NO_SCRATCH_RECLAIM", "1", ("amd",),
              "keeps scratch memory allocated between kernels on Instinct GPUs"),
    EnvPreset("GPU_MAX_HW_QUEUES", "2", ("amd",),
              "fewer HIP hardware queues: less contention for compute/communication overlap"),
    EnvPreset("TOKENIZERS_PARALLELISM", "false", ("nvidia", "amd", None),
              "data-loader workers fork after the tokenizer is loaded"),
)


def resolve_environment(vendor: str | None, environ: dict[str, str], fsdp: bool
                        ) -> dict[str, tuple[str, str, str]]:
    """name -> (value, source, reason) for every preset that applies to this vendor."""
    out: dict[str, tuple[str, str, str]] = {}
    for preset in PRESETS:
        if vendor not in preset.vendors:
            continue
        if preset.name == "CUDA_DEVICE_MAX_CONNECTIONS" and fsdp:
            continue
        if preset.name in environ:
            out[preset.name] = (environ[preset.name], "env", "set in your environment")
        else:
            out[preset.name] = (preset.value, "platform", preset.reason)
    return out
