"""What each GPU platform is: vendor, architecture, memory and dense peak rates.

One table shared by both sides of the torchrun seam: the launcher reads it for capability
checks (PLATFORM=...), the run reads it for MFU. Peaks are dense (no sparsity) TFLOP/s per
GPU, the vendors' datasheet figures the project agreed to use; fp8 peaks are twice bf16. An
unknown GPU has no peak: MFU then says 'peak unknown' instead of guessing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    name: str            # key used by PLATFORM=
    vendor: str          # nvidia | amd
    arch: str            # sm90, sm100, gfx942, gfx950
    memory_gib: float    # HBM per GPU, GiB
    peak_bf16_tflops: float
    match: tuple[str, ...]  # substrings of the device name that identify it (upper case)

    @property
    def peak_fp8_tflops(self) -> float:
        return 2 * self.peak_bf16_tflops

    @property
    def sm(self) -> int | None:
        """CUDA compute capability as an integer (90, 100), None on AMD."""
        return int(self.arch[2:]) if self.arch.startswith("sm") else None

    @property
    def gfx(self) -> int | None:
        """AMD gfx generation as an integer (942, 950), None on NVIDIA."""
        return int(self.arch[3:]) if self.arch.startswith("gfx") else None


# Order matters for name matching: GB200 before B200, H200 before H100 etc. are all distinct
# substrings except GB*/B*, so GB* entries come first.
PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("gb300", "nvidia", "sm100", 279, 2500, ("GB300",)),
    Platform("gb200", "nvidia", "sm100", 186, 2500, ("GB200",)),
    Platform("b300", "nvidia", "sm100", 279, 2250, ("B300",)),
    Platform("b200", "nvidia", "sm100", 179, 2250, ("B200",)),
    Platform("h200", "nvidia", "sm90", 141, 989, ("H200",)),
    Platform("h100", "nvidia", "sm90", 80, 989, ("H100",)),
    Platform("mi355x", "amd", "gfx950", 288, 2500, ("MI355",)),
    Platform("mi325x", "amd", "gfx942", 256, 1307, ("MI325",)),
    Platform("mi300x", "amd", "gfx942", 192, 1307, ("MI300X", "MI300")),
)}


def platform_for_device_name(device_name: str) -> Platform | None:
    """The platform whose name a device reports (torch / nvidia-smi / amd-smi), or None."""
    upper = device_name.upper()
    for platform in PLATFORMS.values():
        if any(token in upper for token in platform.match):
            return platform
    return None

