"""What each GPU platform is: vendor, architecture, memory and dense peak rates.

One table shared by both sides of the torchrun seam: the launcher reads it for capability
checks (PLATFORM=...), the run reads it for MFU. Peaks are dense (no sparsity) TFLOP/s per
GPU, the vendors' datasheet figures the project agreed to use; fp8 peaks are twice bf16. An
unknown GPU has no peak: MFU then says 'peak unknown' instead of guessing.

For the throughput projection (training/optimize/project.py) each platform also carries its
links, each figure per GPU and per direction, with the document it comes from (`sources`):
the scale-up fabric (NVLink / Infinity Fabric xGMI) and how many GPUs share one such domain,
and the scale-out network (the NIC each GPU has in the vendor's reference node).
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
    mx: bool = False     # the tensor cores run MX (microscaled) fp8 at the fp8 rate
    scale_up_gbs: float | None = None     # NVLink / xGMI, GB/s per GPU per direction
    scale_up_domain: int = 8              # GPUs in one NVLink / xGMI domain
    scale_out_gbs: float | None = None    # network between nodes, GB/s per GPU per direction
    sources: str = ""                     # where the peak and link figures come from

    @property
    def peak_fp8_tflops(self) -> float:
        return 2 * self.peak_bf16_tflops

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak for a PRECISION recipe (training/launch/recipes.py): bf16, the fp8
        recipes (tensor-scaled or blockwise: the fp8 rate), mxfp8 (the fp8 rate where the
        tensor cores run MX formats, None otherwise); fp4 recipes are not projected (None)."""
        if precision == "bf16":
            return self.peak_bf16_tflops
        if precision in ("fp8", "fp8_tensorwise", "fp8_blockwise"):
            return self.peak_fp8_tflops
        if precision == "mxfp8":
            return self.peak_fp8_tflops if self.mx else None
        return None

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
_NV_H = ("NVIDIA H100/H200 Tensor Core GPU datasheets (SXM: bf16 989.4 dense TFLOP/s, fp8 "
         "1978.9; NVLink 4 900 GB/s bidirectional); DGX H100/H200 user guide (8x ConnectX-7 "
         "400 Gb/s, one per GPU)")
_NV_B = ("NVIDIA DGX B200 datasheet (72 PFLOPS fp8 training / 8 GPUs, sparse: 4.5 PF dense "
         "fp8 and MXFP8, 2.25 PF bf16 per GPU; NVLink 5 1.8 TB/s bidirectional; 8x "
         "ConnectX-7 400 Gb/s)")
_NV_B300 = ("NVIDIA DGX B300 / HGX B300 datasheet (bf16 2.25 PF dense, fp8 and MXFP8 4.5 PF per "
            "GPU; NVLink 5 1.8 TB/s bidirectional; 8x ConnectX-8 800 Gb/s)")
_NV_GB = ("NVIDIA GB200/GB300 NVL72 datasheet (per GPU bf16 2.5 PF dense, fp8 and MXFP8 5 PF; "
          "NVLink 5 1.8 TB/s bidirectional across the 72-GPU rack; ConnectX-7 400 Gb/s "
          "(GB200) / ConnectX-8 800 Gb/s (GB300) per GPU between racks)")
_AMD_300 = ("AMD Instinct MI300X/MI325X datasheets (bf16 1307.4 dense TFLOP/s, fp8 2614.9; "
            "Infinity Fabric 7 xGMI links x 64 GB/s per direction to the 7 peers); AMD "
            "reference node: one 400 Gb/s NIC per GPU")
_AMD_355 = ("AMD Instinct MI355X datasheet (bf16 2.5 PF dense, fp8 and MXFP8 5.0 PF; Infinity "
            "Fabric 7 xGMI links x 76.8 GB/s per direction, 1075 GB/s total); AMD reference "
            "node: one Pollara 400 Gb/s NIC per GPU")
PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("gb300", "nvidia", "sm100", 279, 2500, ("GB300",), True, 900, 72, 100, _NV_GB),
    Platform("gb200", "nvidia", "sm100", 186, 2500, ("GB200",), True, 900, 72, 50, _NV_GB),
    Platform("b300", "nvidia", "sm100", 279, 2250, ("B300",), True, 900, 8, 100, _NV_B300),
    Platform("b200", "nvidia", "sm100", 179, 2250, ("B200",), True, 900, 8, 50, _NV_B),
    Platform("h200", "nvidia", "sm90", 141, 989, ("H200",), False, 450, 8, 50, _NV_H),
    Platform("h100", "nvidia", "sm90", 80, 989, ("H100",), False, 450, 8, 50, _NV_H),
    Platform("mi355x", "amd", "gfx950", 288, 2500, ("MI355",), True, 537.6, 8, 50, _AMD_355),
    Platform("mi325x", "amd", "gfx942", 256, 1307, ("MI325",), False, 448, 8, 50, _AMD_300),
    Platform("mi300x", "amd", "gfx942", 192, 1307, ("MI300X", "MI300"), False, 448, 8, 50,
             _AMD_300),
)}


def platform_for_device_name(device_name: str) -> Platform | None:
    """The platform whose name a device reports (torch / nvidia-smi / amd-smi), or None."""
    upper = device_name.upper()
    for platform in PLATFORMS.values():
        if any(token in upper for token in platform.match):
            return platform
    return None

