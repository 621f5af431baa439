"""The native AdamW kernel's step time and bandwidth on the GPU, per state mode, with and
without the 16-byte alignment it declares where it can (training/native/adamw_triton.py), and
torch's fused AdamW over fp32 state for scale. Issue 23: the 8-layer step with bf16 states ran
~1% slower than the fp32 default; this shows whether the kernel is where that goes.
Prints one JSON line per case. Usage (GPU machine): python3 dev/gpu/adamw_bandwidth.py"""
from __future__ import annotations

import json

import torch

from training.native import adamw, adamw_triton
from training.native.op_timing import Timer

SIZES = [128256 * 4096, 4096 * 14336, 4096 * 4096, 1024 * 4096, 4096]   # Llama3-8B-like
REPEATS = 10


def timed(fn) -> float:
    """Mean milliseconds of REPEATS calls after one warm-up call (compiles)."""
    fn()
    return Timer(torch.device("cuda"))(fn, REPEATS)


def ours(mode_name: str, moments, aligned: bool) -> dict:
    mode = {"fp32": adamw._FP32_MASTER, "remainder": adamw._REMAINDER,
            "stochastic": adamw._STOCHASTIC}[mode_name]
    ps = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for n in SIZES]
    gs = [torch.randn_like(p) for p in ps]
    ms = [torch.zeros(n, device="cuda", dtype=moments) for n in SIZES]
    vs = [torch.zeros(n, device="cuda", dtype=moments) for n in SIZES]
    opt = adamw.MixedPrecisionAdamW([torch.nn.Parameter(p) for p in ps[:1]], main_params=mode_name)
    xs = [opt._empty_master(p) for p in ps]
    tables = adamw.pointer_tables(ps, gs, ms, vs, xs, adamw.BLOCK)
    hyper = dict(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, bc1=0.1, bc2_sqrt=0.2, seed=1)
    ms_ = timed(lambda: adamw_triton.launch(tables, mode, hyper, adamw.BLOCK, aligned=aligned))
    moved = sum(t.numel() * t.element_size() for ts in (ps, gs, ms, vs, xs) for t in ts)
    moved += sum(t.numel() * t.element_size() for ts in (ps, ms, vs, xs) for t in ts)  # stores
    return {"impl": "native", "mode": mode_name, "moments": str(moments), "aligned": aligned,
            "declared_aligned_by_tables": tables["aligned"], "ms": ms_,
            "gb_per_s": moved / ms_ / 1e6}


def torch_fused() -> dict:
    params = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in SIZES]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    ms_ = timed(opt.step)
    moved = sum(p.numel() * 4 * 7 for p in params)   # read p, g, m, v; write p, m, v
    return {"impl": "torch fused AdamW", "mode": "fp32", "ms": ms_, "gb_per_s": moved / ms_ / 1e6}


def main() -> None:
    print(json.dumps(torch_fused()), flush=True)
    torch.cuda.empty_cache()
    for mode, moments in (("remainder", torch.bfloat16), ("stochastic", torch.bfloat16),
                          ("fp32", torch.float32)):
        for aligned in (False, True):
            print(json.dumps(ours(mode, moments, aligned)), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
