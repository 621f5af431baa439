"""RMSNorm on the GPU: host (launch) time and device time per forward+backward, for the native
backend's implementations at the MoE bench shape's norms (Qwen3-30B-A3B: hidden 2048, q/k norms
over 128-wide heads, 4096 tokens). Exploration for issue 25 (the MoE step is host-bound):
prints one JSON line per (shape, implementation).
Usage (GPU machine): python3 dev/gpu/norm_host_timing.py"""
from __future__ import annotations

import json
import time

import torch

from training.native.norm import rms_norm_liger, rms_norm_torch

IMPLS = {
    "liger": rms_norm_liger,
    "torch_ops": rms_norm_torch,
    "torch_fused": lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps),
}
CALLS = 40   # few enough that the launch queue never fills
SHAPES = {"hidden": (4096, 2048), "q_norm": (4096, 32, 128), "k_norm": (4096, 4, 128)}


def run(fn, x, w, grad, n):
    for _ in range(n):
        y = fn(x, w, 1e-6)
        y.backward(grad)


def main() -> None:
    for shape_name, shape in SHAPES.items():
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.rand(shape[-1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        for name, fn in IMPLS.items():
            run(fn, x, w, grad, 20)
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # the GPU sleeps while the host queues the calls: the loop's wall time is host
            # time only, the events' interval device time only
            torch.cuda._sleep(1_000_000_000)
            begin.record()
            start = time.perf_counter()
            run(fn, x, w, grad, CALLS)
            host_us = (time.perf_counter() - start) / CALLS * 1e6
            end.record()
            torch.cuda.synchronize()
            print(json.dumps({"shape": shape_name, "impl": name, "host_us_per_fwd_bwd": host_us,
                              "device_us_per_fwd_bwd": begin.elapsed_time(end) * 1e3 / CALLS}))


if __name__ == "__main__":
    main()
