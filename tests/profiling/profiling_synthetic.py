"""Build small kineto-format GPU traces with known timings, to test the GPU path on CPU.

Each step of a rank launches the kernels of a *layout*: (name, category, stream, start, dur)
relative to the step's start, in microseconds. The CPU side has what torch.profiler writes:
ProfilerStep#N ranges, the training ranges, a cpu_op and a cudaLaunchKernel (linked to its
kernel by "correlation") per kernel, and gpu_user_annotation copies of the training ranges.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from training.profiling import ranges as rg

GEMM = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT"
NORM = "_rms_norm_forward_kernel"
FLASH = "flash_fwd_kernel"
NCCL = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"
MEMCPY = "Memcpy DtoD (Device -> Device)"

STEP_US = 100
COMPUTE_STREAM = 7
COMM_STREAM = 20

# A step: compute 0-60 (GEMM 0-35, norm 35-40, flash 40-60), NCCL 50-80 on its own stream
# (10 us hidden under flash), memcpy 80-85, idle 85-100.
COMM_HEAVY = [
    (GEMM, "kernel", COMPUTE_STREAM, 0, 35),
    (NORM, "kernel", COMPUTE_STREAM, 35, 5),
    (FLASH, "kernel", COMPUTE_STREAM, 40, 20),
    (NCCL, "kernel", COMM_STREAM, 50, 30),
    (MEMCPY, "gpu_memcpy", COMPUTE_STREAM, 80, 5),
]
# A step: GEMM 0-50, then 50 us with nothing on the GPU.
IDLE_HEAVY = [
    (GEMM, "kernel", COMPUTE_STREAM, 0, 50),
]

# Per analysed step of COMM_HEAVY (the numbers the tests expect).
COMM_HEAVY_STEP = {"compute": 60, "comm_total": 30, "comm_overlapped": 10, "memcpy": 5, "busy": 85}

T0 = 1_000_000  # trace start, us (kineto timestamps are large)
PID = 4242


def _x(cat, name, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def events(layout, steps: int, first_step: int = 10) -> list[dict]:
    ev: list[dict] = []
    corr = 1000
    ext = 1
    for k in range(steps):
        base = T0 + STEP_US * k
        ev.append(_x("user_annotation", f"ProfilerStep#{first_step + k}", base, STEP_US - 1, PID, PID, **{"External id": ext}))
        ext += 1
        fwd_ext = ext
        ev.append(_x("user_annotation", rg.RANGE_FORWARD, base + 1, 60, PID, PID, **{"External id": fwd_ext}))
        ext += 1
        ev.append(_x("user_annotation", rg.RANGE_OPTIMIZER, base + 70, 20, PID, PID, **{"External id": ext}))
        ext += 1
        for i, (name, cat, stream, start, dur) in enumerate(layout):
            cpu_ts = base + 2 + i  # launches come early in the step, kernels run later
            ev.append(_x("cpu_op", "aten::some_op", cpu_ts, 1, PID, PID, **{"External id": ext}))
            ev.append(_x("cuda_runtime", "cudaLaunchKernel", cpu_ts, 1, PID, PID, correlation=corr, **{"External id": ext}))
            gpu_args = {"device": 0, "stream": stream, "correlation": corr, "External id": ext}
            if cat == "gpu_memcpy":
                gpu_args.update({"bytes": 1 << 20, "memory bandwidth (GB/s)": 200.0})
            ev.append(_x(cat, name, base + start, dur, 0, stream, **gpu_args))
            corr += 1
            ext += 1
        ev.append(_x("gpu_user_annotation", rg.RANGE_FORWARD, base, 60, 0, COMPUTE_STREAM, **{"External id": fwd_ext}))
    return ev


def write(path: Path, layout, steps: int = 3, rank: int | None = 0, world: int = 2, gz: bool = False) -> Path:
    doc: dict = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    doc["traceEvents"] = events(layout, steps)
    text = json.dumps(doc, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path
