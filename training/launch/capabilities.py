"""What the target node can do: GPU platform, and which kernel libraries are there.

PLATFORM=auto looks at this node (nvidia-smi / amd-smi / rocm-smi for the GPUs, import checks
for the libraries). PLATFORM=<name> describes that platform as this project's docker image
for it provides it (Transformer Engine everywhere, apex on CUDA), so a launch can be prepared
and checked on a login node or a laptop. Nothing here imports torch.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import shutil
import subprocess
from dataclasses import asdict, dataclass

from training.platforms import PLATFORMS, Platform, platform_for_device_name


@dataclass(frozen=True)
class Capabilities:
    platform: str | None          # a PLATFORMS key, or None when unknown / no GPU
    source: str                   # "detected" | "PLATFORM=<name>"
    device_name: str | None
    gpu_count: int
    transformer_engine: bool
    apex_fused_wgrad: bool        # apex's fused_weight_gradient_mlp_cuda
    liger: bool
    flash_attn: bool
    # Megatron's fused masked softmax (the local spec's unfused attention) imports
    # scaled_masked_softmax_cuda, an apex extension; without it the local backend crashes at
    # the first short-sequence forward, so the launcher turns Megatron's fusion off.
    masked_softmax_kernel: bool = False
    # Transformer Engine's version where it imports here; None on a named platform (its image's
    # TE: 2.17 in rocm/primus:v26.7, NGC 26.03's; both have what the guards ask of TE).
    te_version: str | None = None
    # DeepEP (deep_ep), the kernels of Megatron's flex token dispatcher (MoE); not in the
    # project's images.
    deep_ep: bool = False

    @property
    def info(self) -> Platform | None:
        return PLATFORMS.get(self.platform) if self.platform else None

    @property
    def sm(self) -> int | None:
        return self.info.sm if self.info else None

    @property
    def gfx(self) -> int | None:
        return self.info.gfx if self.info else None

    @property
    def known(self) -> bool:
        return self.info is not None

    def to_dict(self) -> dict:
        return asdict(self)


def for_platform(name: str) -> Capabilities:
    """Capabilities of a named platform running this project's docker image."""
    platform = PLATFORMS[name]
    return Capabilities(
        platform=name, source=f"PLATFORM={name}", device_name=None, gpu_count=8,
        transformer_engine=True, apex_fused_wgrad=platform.vendor == "nvidia",
        liger=True, flash_attn=True, masked_softmax_kernel=platform.vendor == "nvidia")


@functools.cache
def detect() -> Capabilities:
    """Capabilities of this node."""
    names = _gpu_names()
    platform = platform_for_device_name(names[0]) if names else None
    te_version = _te_version()
    return Capabilities(
        platform=platform.name if platform else None, source="detected",
        device_name=names[0] if names else None, gpu_count=len(names),
        transformer_engine=te_version is not None, te_version=te_version,
        apex_fused_wgrad=_imports("fused_weight_gradient_mlp_cuda"),
        liger=_installed("liger_kernel"), flash_attn=_installed("flash_attn"),
        masked_softmax_kernel=_imports("scaled_masked_softmax_cuda"),
        deep_ep=_installed("deep_ep"))


def resolve(platform: str) -> Capabilities:
    return detect() if platform == "auto" else for_platform(platform)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _imports(module: str) -> bool:
    """True when the module is installed and imports (a broken TE install is common)."""
    if not _installed(module):
        return False
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


def _te_version() -> str | None:
    """Transformer Engine's version when it imports here, else None."""
    if not _imports("transformer_engine"):
        return None
    import transformer_engine

    return str(getattr(transformer_engine, "__version__", None) or "unknown")


def _gpu_names() -> list[str]:
    """Names of the visible GPUs, from the vendor tools (no torch import)."""
    queries = (
        ("nvidia-smi", ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]),
        ("amd-smi", ["amd-smi", "static", "--asic", "--csv"]),
        ("rocm-smi", ["rocm-smi", "--showproductname", "--csv"]),
    )
    for tool, command in queries:
        if shutil.which(tool) is None:
            continue
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
        except (OSError, subprocess.SubprocessError):
            continue
        lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if tool == "nvidia-smi":
            return lines
        # AMD tools print a CSV with a header; keep rows naming an Instinct part.
        rows = [line for line in lines[1:] if "MI" in line.upper()]
        if rows:
            return rows
    return []
