"""A float64 AdamW and the harness that runs MixedPrecisionAdamW beside it (shared by the CPU
tests and the GPU test of training/native/adamw.py)."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from training.native.adamw import MOMENT_DTYPES, MixedPrecisionAdamW

REPO = Path(__file__).resolve().parents[2]
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def float64_adamw(init: torch.Tensor, grads: list[torch.Tensor], lr: float, betas, eps: float,
                  weight_decay: float, moments_dtype: torch.dtype | None = None) -> torch.Tensor:
    """AdamW (decoupled weight decay, bias-corrected) in float64. With `moments_dtype` the two
    moments are rounded to it after every step, as a low-precision state stores them."""
    beta1, beta2 = betas
    p = init.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.double()
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        if moments_dtype is not None:
            m = m.to(moments_dtype).double()
            v = v.to(moments_dtype).double()
        denom = v.sqrt() / math.sqrt(1 - beta2 ** t) + eps
        p = p * (1 - lr * weight_decay) - lr / (1 - beta1 ** t) * m / denom
    return p


def problem(shapes, steps: int, seed: int = 0, scale: float = 1.0, grad_mean: float = 0.0,
            device: str = "cpu"):
    """Initial values exactly representable in bf16 and bf16 gradients per step."""
    gen = torch.Generator().manual_seed(seed)
    init = [(torch.randn(s, generator=gen) * scale).to(torch.bfloat16).float().to(device)
            for s in shapes]
    grads = [[(torch.randn(s, generator=gen) + grad_mean).to(torch.bfloat16).to(device)
              for s in shapes] for _ in range(steps)]
    return init, grads


def run(init, grads, main_params: str, moments: str, kernels: str = "torch",
        hyper: dict | None = None, optimizer_hook=None):
    """MixedPrecisionAdamW over bf16 parameters fed `grads` as decoupled gradients (as Megatron's
    precision-aware path feeds it); returns (optimizer, parameters)."""
    hyper = hyper or HYPER
    params = [torch.nn.Parameter(x.clone().to(torch.bfloat16)) for x in init]
    opt = MixedPrecisionAdamW(params, **hyper, master_weights=True,
                              exp_avg_dtype=MOMENT_DTYPES[moments],
                              exp_avg_sq_dtype=MOMENT_DTYPES[moments], use_decoupled_grad=True,
                              main_params=main_params, kernels=kernels)
    if optimizer_hook is not None:
        optimizer_hook(opt)
    continue_steps(opt, params, grads)
    return opt, params


def masters(opt, params) -> list[torch.Tensor]:
    return [opt.get_unscaled_state(p, "master_param").double() for p in params]


def fp32_bound(steps: int, values: list[torch.Tensor]) -> float:
    """How far fp32 arithmetic may drift from float64 in `steps` AdamW steps: each step's
    multiply, divide and subtract round to a few ulps of the parameter (4 x 2^-24 x |p|), and
    the errors are added up linearly (a bound, not an expectation)."""
    largest = max(float(v.abs().max()) for v in values)
    return steps * 4 * 2.0 ** -24 * max(largest, 1.0)


def reference(init, grads, moments_dtype=None, hyper=HYPER) -> list[torch.Tensor]:
    """float64_adamw of each tensor of a problem() (on the CPU)."""
    return [float64_adamw(x.cpu(), [g[i].cpu() for g in grads], **hyper,
                          moments_dtype=moments_dtype) for i, x in enumerate(init)]


def max_error(got, ref) -> float:
    return max(float((a.cpu() - b).abs().max()) for a, b in zip(got, ref))


def sub_ulp_problem(steps: int, n: int, seed: int, device: str = "cpu"):
    """Weights in [1, 4) (bf16 ulp 2^-7..2^-6) and lr 1e-4 with gradients of mean 1: every
    update is far below half an ulp. Returns (hyper, init, grads)."""
    hyper = {**HYPER, "lr": 1e-4, "weight_decay": 0.0}
    gen = torch.Generator().manual_seed(seed)
    init = [(1 + 3 * torch.rand(n, generator=gen)).to(torch.bfloat16).float().to(device)]
    grads = [[(torch.randn(n, generator=gen) * 0.1 + 1.0).to(torch.bfloat16).to(device)]
             for _ in range(steps)]
    return hyper, init, grads


def mean_error_ulp(values: torch.Tensor, ref: torch.Tensor) -> float:
    """The mean of (values - ref) in units of ref's bf16 ulp."""
    ulp = 2.0 ** (torch.floor(torch.log2(ref.abs())) - 7)
    return ((values.double().cpu() - ref) / ulp).mean().item()


def unbiased_tolerance(steps: int, n: int) -> float:
    """5 standard deviations of the mean stochastic-rounding error after `steps` roundings of
    `n` elements, in ulps: each errs by under one ulp with mean zero (variance <= 1/4)."""
    return 5 * steps ** 0.5 / (2 * n ** 0.5)


def fresh_optimizer(params, main_params: str) -> MixedPrecisionAdamW:
    """An optimizer like run()'s (bf16 moments) over other parameters, to resume into."""
    return MixedPrecisionAdamW(params, **HYPER, exp_avg_dtype=torch.bfloat16,
                               exp_avg_sq_dtype=torch.bfloat16, use_decoupled_grad=True,
                               main_params=main_params, kernels="torch")


def continue_steps(opt, params, grads) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.decoupled_grad = g
        opt.step()
