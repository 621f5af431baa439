"""Environment variables the run needs, per vendor and platform, kept in one place.

Every NCCL/RCCL, HIP/HSA, CUDA and Transformer Engine variable the launcher sets is a preset
below, with the reason it is set. The startup table and manifest.json show each one with its
source:

  platform   the launcher sets it (this preset applies to the GPU vendor/platform of the run)
  env        your environment already had a value: yours is kept, always

Variables you set yourself in the NCCL_/RCCL_/HSA_/HIP_/NVTE_ families are listed too
(source env), so the manifest records the communication and kernel settings a run had.

Left alone on purpose: NCCL_NVLS_ENABLE (NVLink SHARP multicast). NCCL decides it per
machine; some machines (e.g. a shared GPU host) must keep it as their administrator set it.

`python -m training.launch.environment` prints the preset table (docs/launch.md embeds it).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

ALL_VENDORS = ("nvidia", "amd")
# A name bash can export (anything else in the environment is never passed on).
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class EnvPreset:
    name: str
    value: str
    vendors: tuple[str | None, ...]   # None: also when no GPU is known (a DRY_RUN on a laptop)
    reason: str
    platforms: tuple[str, ...] = ()   # non-empty: only these PLATFORMS keys
    needs_te: bool = False            # only with TRANSFORMER_IMPL=transformer_engine
    not_with_fsdp: bool = False
    toggle: str | None = None         # only when this (0/1) toggle is on


PRESETS: tuple[EnvPreset, ...] = (
    # -- both vendors ---------------------------------------------------------------------------
    EnvPreset("CUDA_DEVICE_MAX_CONNECTIONS", "1", ALL_VENDORS,
              "one hardware queue keeps tensor/sequence-parallel communication ordered before "
              "compute (Megatron asserts it for TP/CP > 1 before Blackwell); left unset with "
              "FSDP, which needs more than one", not_with_fsdp=True),
    EnvPreset("TORCH_NCCL_HIGH_PRIORITY", "1", ALL_VENDORS,
              "NCCL/RCCL streams at high priority so overlapped collectives are not starved "
              "by compute kernels"),
    EnvPreset("TOKENIZERS_PARALLELISM", "false", (*ALL_VENDORS, None),
              "data-loader workers fork after the tokenizer is loaded; Rust tokenizer threads "
              "would warn and may deadlock"),
    # -- NVIDIA ---------------------------------------------------------------------------------
    EnvPreset("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", ("nvidia",),
              "the caching allocator grows segments instead of fragmenting: fewer OOMs at "
              "long sequence"),
    # -- AMD ------------------------------------------------------------------------------------
    EnvPreset("HSA_NO_SCRATCH_RECLAIM", "1", ("amd",),
              "keeps kernel scratch memory allocated between kernels on Instinct GPUs instead "
              "of reclaiming it (stalls and instability otherwise)"),
    EnvPreset("GPU_MAX_HW_QUEUES", "2", ("amd",),
              "fewer HIP hardware queues: less contention between compute and the "
              "communication streams that overlap it"),
    EnvPreset("HIP_FORCE_DEV_KERNARG", "1", ("amd",),
              "kernel arguments go straight to device memory: lower launch latency for the "
              "many small kernels of a training step"),
    EnvPreset("NVTE_CK_USES_BWD_V3", "1", ("amd",),
              "Transformer Engine's CK fused attention uses the faster v3 backward kernels",
              needs_te=True),
    EnvPreset("NVTE_CK_IS_V3_ATOMIC_FP32", "1", ("amd",),
              "MI300X/MI325X: the v3 attention backward accumulates with fp32 atomics, AMD's "
              "recommended setting for these GPUs", platforms=("mi300x", "mi325x"),
              needs_te=True),
    EnvPreset("TE_HIPBLASLT_TUNING_RUN_COUNT", "10", ("amd", None),
              "GEMM_TUNING=1: Transformer Engine times each hipBLASLt GEMM candidate this many "
              "times (the ROCm fork's value)", needs_te=True, toggle="GEMM_TUNING"),
    EnvPreset("TE_HIPBLASLT_TUNING_ALGO_COUNT", "50", ("amd", None),
              "GEMM_TUNING=1: hipBLASLt algorithms Transformer Engine tries per GEMM (the ROCm "
              "fork's value)", needs_te=True, toggle="GEMM_TUNING"),
)

# Names never set by the launcher (a test keeps it so), whatever the platform.
UNTOUCHED = ("NCCL_NVLS_ENABLE",)

# Families of variables a user may set that change communication or kernels: shown and recorded
# (GLOO_SOCKET_IFNAME and HF_TOKEN: the ROCm fork's scripts and docs name them).
USER_FAMILIES = ("NCCL_", "RCCL_", "TORCH_NCCL_", "HSA_", "HIP_", "GPU_MAX_", "NVTE_", "GLOO_",
                 "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS",
                 "HF_TOKEN")

# Secrets (what is one, how it is masked) are decided in one place: training/credentials.py.
from training.credentials import MASK, is_secret, shown  # noqa: E402,F401  (the names the readers import)


def applies(preset: EnvPreset, vendor: str | None, platform: str | None, backend: str | None,
            fsdp: bool, toggles_on: frozenset[str] = frozenset()) -> bool:
    """Whether a preset is set for this vendor, platform, backend, FSDP choice and the 0/1
    toggles that are on. An unknown backend (None) counts as Transformer Engine: the preset is
    shown."""
    if vendor not in preset.vendors:
        return False
    if preset.toggle is not None and preset.toggle not in toggles_on:
        return False
    if preset.platforms and platform not in preset.platforms:
        return False
    if preset.needs_te and backend not in (None, "transformer_engine"):
        return False
    return not (preset.not_with_fsdp and fsdp)


def resolve_environment(vendor: str | None, environ: dict[str, str], fsdp: bool,
                        platform: str | None = None, backend: str | None = None,
                        toggles_on: frozenset[str] = frozenset()
                        ) -> dict[str, tuple[str, str, str]]:
    """name -> (value, source, reason): the presets that apply, then the user's own variables
    of the families above. A user's value always wins and is never changed (FSDP with the
    user's CUDA_DEVICE_MAX_CONNECTIONS=1 is refused by the guard `environment`)."""
    out: dict[str, tuple[str, str, str]] = {}
    for preset in PRESETS:
        if not applies(preset, vendor, platform, backend, fsdp, toggles_on):
            continue
        if preset.name in environ:
            out[preset.name] = (environ[preset.name], "env",
                                f"set in your environment (the {vendor or 'default'} preset "
                                f"would be {preset.value})")
        else:
            out[preset.name] = (preset.value, "platform", preset.reason)
    for name in sorted(environ):
        if name not in out and name.startswith(USER_FAMILIES) and SHELL_NAME.fullmatch(name):
            out[name] = (environ[name], "env", "set in your environment: passed through unchanged")
    return out


def markdown_table() -> str:
    """The preset table of docs/launch.md (a test checks the doc against it)."""
    rows = ["| variable | value | vendors | only on | why |", "| --- | --- | --- | --- | --- |"]
    for p in PRESETS:
        vendors = ", ".join("any (no GPU known)" if v is None else v for v in p.vendors)
        only = [*p.platforms] + (["TE backend"] if p.needs_te else []) + (
            ["not with FSDP"] if p.not_with_fsdp else []) + (
            [f"{p.toggle}=1"] if p.toggle else [])
        rows.append(f"| `{p.name}` | `{p.value}` | {vendors} | {', '.join(only) or '-'} | "
                    f"{p.reason} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
