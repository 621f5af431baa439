"""The Triton kernel of training/native/adamw.py under Triton's CPU interpreter, for
tests/native/test_adamw.py (run with TRITON_INTERPRET=1 in a fresh process): prints one JSON
line of measurements; the test asserts on them.

    TRITON_INTERPRET=1 python -m tests.native.adamw_interpreted fp32/bf16 | remainder/bf16 | ...
    TRITON_INTERPRET=1 python -m tests.native.adamw_interpreted short   # seconds: the default run
"""
from __future__ import annotations

import json
import sys

import torch

from training.native import adamw, adamw_triton
from training.native.adamw import split_fp32

from .adamw_reference import (HYPER, fp32_bound, masters, max_error, mean_error_ulp, problem,
                              reference, run, sub_ulp_problem, unbiased_tolerance)

BLOCK = 256  # small blocks: several per tensor, one cut mid-tensor


def _interpreted(opt) -> None:
    """The optimizer's CUDA branch, routed to the kernel on CPU tensors."""
    def update(ps, gs, ms, vs, xs, mode, hyper):
        tables = adamw.pointer_tables(ps, gs, ms, vs, xs, BLOCK)
        adamw_triton.launch(tables, mode, hyper, BLOCK)
    opt._use_triton = lambda device: True
    opt._triton_update = update


# sizes cut mid-vector (the element-wise accesses), and multiples of 8 (the ALIGNED path)
SHAPES = {"odd": [(37,), (700,), (300,)], "aligned": [(40,), (704,), (296,)]}


def tracking(main_params: str, moments: str, shapes: str = "odd") -> dict:
    steps = 40
    init, grads = problem(SHAPES[shapes], steps)
    opt, params = run(init, grads, main_params, moments, optimizer_hook=_interpreted)
    ref = reference(init, grads, torch.bfloat16 if moments == "bf16" else None)
    bound = fp32_bound(steps, ref) + (steps * HYPER["lr"] * 2.0 ** -7 if moments == "bf16"
                                      else 0.0)
    torch_opt, torch_params = run(init, grads, main_params, moments)
    tables = adamw.pointer_tables(params, params, params, params, params, BLOCK)
    return {"aligned": tables["aligned"], "error": max_error(masters(opt, params), ref),
            "bound": bound,
            "error_vs_torch": max_error(masters(opt, params), masters(torch_opt, torch_params))}


def short() -> dict:
    """Three steps of the remainder mode (fp32 moments, so the two paths differ only by fp32
    rounding) on the kernel and on the torch path. From the second step on the kernel rebuilds
    each master from the bf16 parameter and its remainder, where a negative remainder means
    the high half was rounded up (one bf16 ulp off if the kernel forgets it)."""
    steps = 3
    init, grads = problem(SHAPES["odd"][:2], steps)
    opt, params = run(init, grads, "remainder", "fp32", optimizer_hook=_interpreted)
    torch_opt, torch_params = run(init, grads, "remainder", "fp32")
    got, ref = masters(opt, params), masters(torch_opt, torch_params)
    return {"error_vs_torch": max_error(got, ref), "bound": fp32_bound(steps, ref),
            "negative_remainders": sum(int((split_fp32(m.float())[1] < 0).sum()) for m in got),
            "elements": sum(m.numel() for m in got)}


def stochastic() -> dict:
    steps, n = 30, 4000
    hyper, init, grads = sub_ulp_problem(steps, n, seed=9)
    opt, params = run(init, grads, "stochastic", "fp32", hyper=hyper,
                      optimizer_hook=_interpreted)
    ref = reference(init, grads, hyper=hyper)[0]
    moved = (params[0].double() - init[0].double()).tolist()
    return {"mean_error_ulp": mean_error_ulp(params[0], ref),
            "tolerance_ulp": unbiased_tolerance(steps, n),
            "distinct_updates": len({round(x, 6) for x in moved})}


def main(scenario: str) -> dict:
    if scenario == "stochastic":
        return stochastic()
    if scenario == "short":
        return short()
    main_params, moments, *shapes = scenario.split("/")
    return tracking(main_params, moments, *shapes)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
