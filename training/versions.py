"""The software stack a run sees: one version manifest, printed at start and kept in manifest.json.

    collect_versions()        torch, megatron-core, Transformer Engine, apex, NCCL or RCCL,
                              CUDA or ROCm/HIP, cuDNN, the GPU driver, device name and count
    launcher_versions()       the same without importing torch (the launcher, a login node)

Every entry is a string or None: a missing piece (no GPU, no apex, no driver tool) is None,
never an error. The outside world is reached only through a Probe, so tests use a fake one.

    python -m training.versions                      # JSON of collect_versions()
    python -m training.versions --no-torch           # launcher_versions()
    python -m training.versions --require torch,transformer-engine
    python -m training.versions snapshot FILE        # write the JSON (docker build: before installing)
    python -m training.versions unchanged FILE torch transformer-engine apex
                                                     # exit 1 when one of them changed since FILE
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform as _platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from training.cli import ArgumentParser, BadFile, fail, write_text
from training.reading import read_json

# Distribution names to try, per entry (wheels and source builds spell some differently).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "megatron-core": ("megatron-core",),
    "transformer-engine": ("transformer-engine", "transformer-engine-torch",
                           "transformer-engine-cu12", "transformer-engine-cu13"),
    "apex": ("apex",),
    "liger-kernel": ("liger-kernel",),
    "triton": ("triton", "pytorch-triton-rocm", "pytorch-triton"),
    "flash-attn": ("flash-attn",),
    "aiter": ("amd-aiter", "aiter"),
}
# Module whose __version__ answers when no distribution metadata exists (source installs).
MODULE_VERSION = {"megatron-core": "megatron.core.package_info",
                  "transformer-engine": "transformer_engine", "apex": "apex", "aiter": "aiter"}

KEYS = ("python", "torch", "megatron-core", "transformer-engine", "apex", "liger-kernel",
        "triton", "flash-attn", "aiter", "cuda", "hip", "rocm", "cudnn", "nccl", "rccl",
        "driver", "device", "device_count")


class Probe:
    """Everything collect_versions asks of the machine."""

    def distribution(self, name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def module_version(self, module: str) -> str | None:
        """__version__ of a module, imported only if it is installed."""
        try:
            if importlib.util.find_spec(module.split(".")[0]) is None:
                return None
            return str(getattr(importlib.import_module(module), "__version__", None) or "") or None
        except Exception:  # noqa: BLE001 - a broken install reports no version
            return None

    def installed(self, module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    def torch(self) -> Any | None:
        try:
            import torch
        except Exception:  # noqa: BLE001 - no torch (or a broken one): no torch entries
            return None
        return torch

    def run(self, argv: list[str]) -> str | None:
        if shutil.which(argv[0]) is None:
            return None
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def _quiet(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - one missing piece never stops the manifest
        return None


def package_version(entry: str, probe: Probe) -> str | None:
    for dist in DISTRIBUTIONS.get(entry, (entry,)):
        version = probe.distribution(dist)
        if version:
            return version
    module = MODULE_VERSION.get(entry)
    if module and probe.installed(module.split(".")[0]):
        return probe.module_version(module) or "installed (version unknown)"
    return None


def nvidia_driver(probe: Probe) -> str | None:
    out = probe.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    lines = [x.strip() for x in (out or "").splitlines() if x.strip()]
    if lines:
        return lines[0]
    text = probe.read("/proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", text)
    return match.group(1) if match else None


def amd_driver(probe: Probe) -> str | None:
    text = (probe.read("/sys/module/amdgpu/version") or "").strip()
    if text:
        return text
    out = probe.run(["amd-smi", "version"]) or ""
    match = re.search(r"amdgpu version:\s*([^\s|]+)", out, re.IGNORECASE)
    return match.group(1) if match else None


def rocm_version(probe: Probe) -> str | None:
    for root in (probe.env("ROCM_PATH"), "/opt/rocm"):
        if root:
            text = (probe.read(f"{root}/.info/version") or "").strip()
            if text:
                return text
    return None


def _torch_entries(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": str(torch.__version__)}
    version = getattr(torch, "version", None)
    out["cuda"] = getattr(version, "cuda", None)
    out["hip"] = getattr(version, "hip", None)
    out["cudnn"] = _quiet(lambda: str(torch.backends.cudnn.version())
                          if torch.backends.cudnn.is_available() else None)
    collective = _quiet(lambda: ".".join(str(x) for x in torch.cuda.nccl.version()))
    out["rccl" if out["hip"] else "nccl"] = collective
    if _quiet(torch.cuda.is_available):
        out["device"] = _quiet(torch.cuda.get_device_name)
        out["device_count"] = _quiet(torch.cuda.device_count)
        api = _quiet(torch._C._cuda_getDriverVersion) if not out["hip"] else None
        if api:
            out["_driver_api"] = f"CUDA driver API {api // 1000}.{api % 1000 // 10}"
    return out


def collect_versions(probe: Probe | None = None, import_torch: bool = True) -> dict[str, Any]:
    """The stack as seen here, every KEYS entry present (None where a piece is missing)."""
    probe = probe or Probe()
    out: dict[str, Any] = dict.fromkeys(KEYS)
    out["python"] = _platform.python_version()
    torch = probe.torch() if import_torch else None
    if torch is not None:
        out.update(_quiet(_torch_entries, torch) or {"torch": _quiet(lambda: str(torch.__version__))})
    else:
        out["torch"] = probe.distribution("torch")
    for entry in DISTRIBUTIONS:
        out[entry] = _quiet(package_version, entry, probe)
    driver_api = out.pop("_driver_api", None)
    out["rocm"] = _quiet(rocm_version, probe)
    if torch is not None:
        amd = bool(out["hip"])
    else:  # no torch to ask: a ROCm install or a loaded amdgpu module says AMD
        amd = out["rocm"] is not None or probe.read("/sys/module/amdgpu/version") is not None
    out["driver"] = _quiet(amd_driver if amd else nvidia_driver, probe) or driver_api
    return out


def launcher_versions(probe: Probe | None = None) -> dict[str, Any]:
    """What the launcher records in manifest.json before torchrun: package metadata, driver,
    ROCm; torch is not imported (a login node or laptop may not have a working one)."""
    return collect_versions(probe, import_torch=False)


def format_versions(versions: dict[str, Any]) -> str:
    """One line for the log: the entries that are known."""
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v not in (None, ""))


def changed(before: dict[str, Any], after: dict[str, Any], names: list[str]) -> list[str]:
    """The named entries whose version differs (a newly missing one counts as changed)."""
    return [f"{n}: {before.get(n)} -> {after.get(n)}" for n in names
            if before.get(n) != after.get(n)]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.versions",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-torch", action="store_true", help="do not import torch")
    parser.add_argument("--require", default="",
                        help="comma list of entries that must be present (exit 1 otherwise)")
    parser.add_argument("action", nargs="?", choices=("show", "snapshot", "unchanged"),
                        default="show")
    parser.add_argument("file", nargs="?", help="JSON file for snapshot/unchanged")
    parser.add_argument("names", nargs="*", help="entries that must not change (unchanged)")
    args = parser.parse_args(argv)

    versions = collect_versions(import_torch=not args.no_torch)
    if args.action == "show":
        print(json.dumps(versions, indent=1))
    elif args.action == "snapshot":
        if not args.file:
            parser.error("snapshot needs a FILE")
        try:
            write_text(args.file, json.dumps(versions, indent=1) + "\n", "version snapshot")
        except BadFile as err:
            return fail(str(err))
        print(format_versions(versions))
    else:
        if not args.file or not args.names:
            parser.error("unchanged needs a FILE and entry names")
        try:
            before = read_json(args.file, "version snapshot")
        except BadFile as err:
            return fail(str(err))
        if not isinstance(before, dict):
            return fail(f"{args.file}: not a version snapshot (python -m training.versions snapshot FILE writes one)")
        diffs = changed(before, versions, args.names)
        if diffs:
            print("error: the image's own stack changed while installing this package:\n  "
                  + "\n  ".join(diffs) + "\nPin a compatible version instead of replacing it.",
                  file=sys.stderr)
            return 1
        print("unchanged: " + ", ".join(f"{n} {versions.get(n)}" for n in args.names))
    missing = [n for n in args.require.split(",") if n and not versions.get(n)]
    if missing:
        print(f"error: missing here: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
