"""The native MixedPrecisionAdamW on CUDA: its Triton kernel (and torch path) against a float64
AdamW, the state it allocates and the step's temporaries; then the optimizer-state toggles
through the launcher on the tiny preset (falling loss, a resume, the CPU offload)."""
from __future__ import annotations

import pytest
import torch

from tests.native.adamw_reference import (HYPER, fp32_bound, masters, max_error,
                                         mean_error_ulp, problem, reference, run,
                                         sub_ulp_problem, unbiased_tolerance)

pytestmark = pytest.mark.gpu

SHAPES = [(37,), (1000, 333), (4097,), (1 << 20,)]   # odd sizes, blocks cut mid-tensor
# sizes that are multiples of 8: the kernel's 16-byte vector accesses (ALIGNED)
ALIGNED_SHAPES = [(40,), (1000, 336), (4104,), (1 << 20,)]


@pytest.mark.parametrize("shapes", [SHAPES, ALIGNED_SHAPES], ids=["odd", "aligned"])
@pytest.mark.parametrize("kernels", ["triton", "torch"])
@pytest.mark.parametrize("main_params,moments", [("fp32", "fp32"), ("remainder", "fp32"),
                                                 ("fp32", "bf16"), ("remainder", "bf16")])
def test_step_on_cuda_tracks_float64_adamw(kernels, main_params, moments, shapes):
    """Tolerances as in tests/native/test_adamw.py: fp32 arithmetic (the linear bound), plus
    for bf16 moments one bf16 rounding flip per element and step against a float64 AdamW that
    rounds its moments to bf16 too."""
    steps = 60
    init, grads = problem(shapes, steps, device="cuda")
    opt, params = run(init, grads, main_params, moments, kernels=kernels)
    ref = reference(init, grads, torch.bfloat16 if moments == "bf16" else None)
    bound = fp32_bound(steps, ref) + (steps * HYPER["lr"] * 2.0 ** -7 if moments == "bf16"
                                      else 0.0)
    error = max_error(masters(opt, params), ref)
    print(f"\n{kernels} {main_params}/{moments}: max error {error:.2e} (bound {bound:.2e})")
    assert error <= bound


@pytest.mark.parametrize("main_params,moments", [("fp32", "fp32"), ("fp32", "bf16"),
                                                 ("remainder", "bf16"), ("stochastic", "bf16")])
def test_vector_accesses_compute_what_element_accesses_do(main_params, moments):
    """The kernel with its accesses declared 16-byte aligned (vectors) and without: the same
    state, bit for bit, after a step on the same tensors."""
    from training.native import adamw, adamw_triton

    gen = torch.Generator(device="cuda").manual_seed(3)
    dtype = adamw.MOMENT_DTYPES[moments]
    sizes = [n for shape in ALIGNED_SHAPES for n in [int(torch.Size(shape).numel())]]
    ps = [torch.randn(n, generator=gen, device="cuda").to(torch.bfloat16) for n in sizes]
    gs = [torch.randn(n, generator=gen, device="cuda").to(torch.bfloat16) for n in sizes]
    ms = [torch.randn(n, generator=gen, device="cuda").abs().to(dtype) * 0.1 for n in sizes]
    vs = [torch.rand(n, generator=gen, device="cuda").to(dtype) * 0.01 for n in sizes]
    opt = adamw.MixedPrecisionAdamW([torch.nn.Parameter(ps[0])], main_params=main_params)
    xs = [opt._empty_master(p) for p in ps]
    mode = opt._mode(ps[0])
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, bc1=0.1, bc2_sqrt=0.2, seed=5)
    after = []
    for aligned in (False, True):
        state = [[t.clone() for t in ts] for ts in (ps, gs, ms, vs, xs)]
        tables = adamw.pointer_tables(*state, adamw.BLOCK)
        assert tables["aligned"]
        adamw_triton.launch(tables, mode, hyper, adamw.BLOCK, aligned=aligned)
        after.append(state)
    for got, want in zip(after[1], after[0]):
        for a, b in zip(got, want):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_remainder_and_fp32_masters_agree_bit_for_bit_on_cuda():
    init, grads = problem(SHAPES, 30, device="cuda")
    a_opt, a = run(init, grads, "fp32", "bf16", kernels="triton")
    b_opt, b = run(init, grads, "remainder", "bf16", kernels="triton")
    for x, y in zip(masters(a_opt, a), masters(b_opt, b)):
        assert torch.equal(x, y)


def test_stochastic_rounding_on_cuda_is_unbiased():
    steps, n = 100, 1 << 20
    hyper, init, grads = sub_ulp_problem(steps, n, seed=7, device="cuda")
    opt, params = run(init, grads, "stochastic", "bf16", kernels="triton", hyper=hyper)
    ref = reference(init, grads, torch.bfloat16, hyper)[0]
    error, drift = mean_error_ulp(params[0], ref), mean_error_ulp(init[0], ref)
    tolerance = unbiased_tolerance(steps, n)
    print(f"\nmean error {error:+.4f} ulp (tolerance {tolerance:.4f}), drift {drift:+.3f} ulp")
    assert abs(error) <= tolerance and abs(drift) > 20 * tolerance


@pytest.mark.parametrize("main_params,moments,per_param", [
    ("fp32", "fp32", 12), ("remainder", "bf16", 6), ("stochastic", "bf16", 4)])
def test_state_memory_and_no_step_temporary(main_params, moments, per_param):
    """What the state takes on the GPU (bytes per parameter, as the memory estimator has
    them) and that the Triton step allocates nothing beyond its small tables."""
    n = 1 << 26                                               # 64M parameters
    init, grads = problem([(n,)], 1, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    opt, params = run(init, grads, main_params, moments, kernels="triton")
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated() - before - n * 2    # minus the bf16 parameter
    assert abs(state - per_param * n) <= 0.01 * per_param * n
    torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated()
    params[0].decoupled_grad = grads[0][0]
    opt.step()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - held < 1 << 20


# -- through the launcher ----------------------------------------------------------------------

def test_tiny_trains_the_recorded_curve_and_resumes_with_bf16_moments_and_remainders(tmp_path):
    """The tiny 30-iteration run (tests/gpu/test_train_gpu.py) with ADAM_MOMENTS_DTYPE=bf16
    MASTER_WEIGHTS=remainder: the late loss within that test's tolerance of the recorded
    fp32-state curve, and a resume from iteration 15 continuing it (as its resume test).

    Mutation meant: the kernel's bias correction dropped (bc1 = bc2 = 1 in
    training/native/adamw.py's hyper): the early updates shrink ~10x and the curve moves."""
    from tests.gpu.test_train_gpu import (LATE_LOSS_TOL, RECORDED_LATE_LOSS, _losses,
                                          _mean_loss, _train)

    state = dict(ADAM_MOMENTS_DTYPE="bf16", MASTER_WEIGHTS="remainder")
    ckpt = tmp_path / "ckpt"
    full = _train(tmp_path, "full", TOTAL_ITERS=30, SAVE=ckpt, SAVE_INTERVAL=15, **state)
    losses = _losses(full)
    late = _mean_loss(losses, 26, 30)
    print(f"\nbf16 moments + remainder masters: late loss {late:.3f} "
          f"(recorded fp32 state {RECORDED_LATE_LOSS['native']})")
    assert abs(late - RECORDED_LATE_LOSS["native"]) < LATE_LOSS_TOL
    resumed = _train(tmp_path, "resumed", "--ckpt-step", "15", TOTAL_ITERS=30, LOAD=ckpt,
                     **state)
    again = _losses(resumed)
    assert sorted(again) == list(range(16, 31))
    worst = max(abs(losses[i] - again[i]) / losses[i] for i in range(16, 31))
    print(f"resume: worst relative loss difference over iterations 16-30: {worst:.2e}")
    assert worst < 1e-3


def test_tiny_trains_the_recorded_curve_with_the_optimizer_on_the_cpu(tmp_path):
    """OPTIMIZER_CPU_OFFLOAD=1: Megatron's HybridDeviceOptimizer, fp32 state on the host,
    torch's CPU AdamW: the same arithmetic as the default, so the recorded curve."""
    from tests.gpu.test_train_gpu import (LATE_LOSS_TOL, RECORDED_LATE_LOSS, _losses,
                                          _mean_loss, _train)

    late = _mean_loss(_losses(_train(tmp_path, "offload", TOTAL_ITERS=30,
                                     OPTIMIZER_CPU_OFFLOAD=1)), 26, 30)
    print(f"\nCPU offload: late loss {late:.3f} (recorded {RECORDED_LATE_LOSS['native']})")
    assert abs(late - RECORDED_LATE_LOSS["native"]) < LATE_LOSS_TOL
