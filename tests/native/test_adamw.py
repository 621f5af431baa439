"""training/native/adamw.py against a float64 AdamW over many steps (CPU: the torch path, and
the Triton kernel under Triton's interpreter); the bytes of state per parameter; the state's
round trip through a state dict and through Megatron's fp32 get/set interface."""
from __future__ import annotations

import pytest
import torch

from training.native import adamw
from training.native.adamw import (MixedPrecisionAdamW, join_fp32, split_fp32,
                                   stochastic_round_bf16)

from .adamw_reference import (HYPER, continue_steps, fp32_bound, fresh_optimizer, masters,
                              max_error, mean_error_ulp, problem, reference, run,
                              sub_ulp_problem, unbiased_tolerance)

SHAPES = [(37,), (64, 33), (3000,)]
STEPS = 100


@pytest.mark.parametrize("main_params", ["fp32", "remainder"])
def test_fp32_moments_track_float64_adamw_to_fp32_rounding(main_params):
    """fp32 moments with an fp32 master (a copy, or bf16 + 16-bit remainder): the master stays
    within the fp32 arithmetic bound of a float64 AdamW fed the same bf16 gradients."""
    init, grads = problem(SHAPES, STEPS)
    opt, params = run(init, grads, main_params, "fp32")
    ref = reference(init, grads)
    got = masters(opt, params)
    assert max_error(got, ref) <= fp32_bound(STEPS, ref)


def test_the_fp32_bound_catches_a_one_percent_error_in_the_update():
    """The bound can fail: against a reference whose learning rate is 1% larger."""
    init, grads = problem(SHAPES, STEPS)
    opt, params = run(init, grads, "fp32", "fp32")
    off = reference(init, grads, hyper={**HYPER, "lr": HYPER["lr"] * 1.01})
    assert max_error(masters(opt, params), off) > fp32_bound(STEPS, off)


def test_bf16_moments_match_float64_adamw_with_bf16_stored_moments():
    """bf16 moments: against a float64 AdamW that rounds its moments to bf16 after each step
    the master agrees to the fp32 bound, except where fp32 and float64 land on the two sides of
    a bf16 rounding boundary (about 2^-24 / 2^-9 of the roundings). Such a flip moves one
    moment by one bf16 ulp (2^-8 relative): the update of that element by at most lr x 2^-7
    in that step, decaying after. Bound: the fp32 bound plus one flip per element per step."""
    init, grads = problem(SHAPES, STEPS)
    opt, params = run(init, grads, "fp32", "bf16")
    ref = reference(init, grads, torch.bfloat16)
    error = max_error(masters(opt, params), ref)
    assert error <= fp32_bound(STEPS, ref) + STEPS * HYPER["lr"] * 2.0 ** -7
    # and far closer than to a float64 AdamW with exact moments (what bf16 storage costs)
    exact = reference(init, grads)
    assert error < max_error(masters(opt, params), exact)


def test_bf16_moments_stay_within_their_rounding_bound_of_exact_adamw():
    """Against exact (float64) moments: each stored moment is rounded by at most 2^-9 of
    itself per step; the roundings decay with beta, so m carries at most 2^-9/(1-beta1) and v
    2^-9/(1-beta2) of relative error, the update m/sqrt(v) at most the sum of m's and half of
    v's, and |update| <= lr (Adam's bound with (1-beta1) <= sqrt(1-beta2)). Linear over the
    steps."""
    init, grads = problem(SHAPES, STEPS)
    opt, params = run(init, grads, "remainder", "bf16")
    beta1, beta2 = HYPER["betas"]
    relative = 2.0 ** -9 / (1 - beta1) + 0.5 * 2.0 ** -9 / (1 - beta2)
    ref = reference(init, grads)
    bound = STEPS * HYPER["lr"] * relative + fp32_bound(STEPS, ref)
    assert max_error(masters(opt, params), ref) <= bound


@pytest.mark.parametrize("moments", ["fp32", "bf16"])
def test_remainder_master_is_the_fp32_master_bit_for_bit(moments):
    """MAIN_PARAMS=remainder keeps the same fp32 master as an fp32 copy, in 2 bytes instead of
    4, and its bf16 parameter is that master rounded to nearest."""
    init, grads = problem(SHAPES, 50)
    copy_opt, copy_params = run(init, grads, "fp32", moments)
    rem_opt, rem_params = run(init, grads, "remainder", moments)
    for a, b in zip(masters(copy_opt, copy_params), masters(rem_opt, rem_params)):
        assert torch.equal(a, b)
    for master, p in zip(masters(rem_opt, rem_params), rem_params):
        ulp = 2.0 ** (torch.floor(torch.log2(master.abs().clamp_min(1e-30))) - 7)
        assert bool(((p.double() - master).abs() <= ulp / 2).all())


def test_split_and_join_are_exact_and_round_the_high_half_to_nearest():
    gen = torch.Generator().manual_seed(3)
    values = torch.cat([torch.randn(10000, generator=gen) * 10.0 ** k for k in (-20, -3, 0, 3, 20)]
                       + [torch.tensor([0.0, -0.0, 1.0, -1.0])])
    high, low = split_fp32(values)
    assert torch.equal(join_fp32(high, low).view(torch.int32), values.view(torch.int32))
    as_bf16 = high.view(torch.bfloat16).double()
    nearest = values.to(torch.bfloat16).double()
    differ = as_bf16 != nearest  # only at exact ties (low half 0x8000): away from zero vs even
    assert int(differ.sum()) <= 1 + values.numel() // 1000
    assert bool((low[differ] == -32768).all())


def test_stochastic_rounding_is_unbiased_where_round_to_nearest_stalls():
    """MAIN_PARAMS=stochastic: updates far below bf16's resolution (lr 1e-4 on weights in
    [1, 4)) still move the weights on average: the mean error stays within 5 standard
    deviations of an unbiased rounding (adamw_reference.unbiased_tolerance), while the weights
    move by about N x lr. Rounding to nearest (a bf16 master without compensation) would not
    move at all."""
    steps, n = 100, 80000
    hyper, init, grads = sub_ulp_problem(steps, n, seed=7)
    opt, params = run(init, grads, "stochastic", "fp32", hyper=hyper)
    ref = reference(init, grads, hyper=hyper)[0]
    tolerance = unbiased_tolerance(steps, n)
    assert abs(mean_error_ulp(params[0], ref)) <= tolerance
    assert abs(mean_error_ulp(init[0], ref)) > 5 * tolerance  # the weights did move, and
    # rounding to nearest keeps exactly the initial bf16 weights, every step


def test_stochastic_round_of_a_value_halfway_goes_each_way_about_half_the_time():
    value = torch.full((40000,), 1.0 + 2.0 ** -8)  # halfway between two bf16 neighbours
    rounded = stochastic_round_bf16(value, torch.Generator().manual_seed(0)).double()
    up = (rounded > 1.0).double().mean().item()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2.0 ** -7}
    assert abs(up - 0.5) < 5 * 0.5 / 200  # 5 standard deviations of a fair coin over 40000


@pytest.mark.parametrize("main_params,moments,per_param", [
    ("fp32", "fp32", 12), ("fp32", "bf16", 8), ("remainder", "fp32", 10),
    ("remainder", "bf16", 6), ("stochastic", "bf16", 4), ("stochastic", "fp32", 8)])
def test_state_bytes_per_parameter(main_params, moments, per_param):
    """What the state holds per bf16 parameter element (the memory estimator's terms:
    training.optimize.memory.optimizer_state_bytes), counted from the tensors themselves."""
    from training.optimize.memory import optimizer_state_bytes

    init, grads = problem(SHAPES, 1)
    opt, params = run(init, grads, main_params, moments)
    numel = sum(p.numel() for p in params)
    counted = sum(t.untyped_storage().nbytes() for s in opt.state.values()
                  for k, t in s.items() if k != "step")
    assert counted == opt.state_bytes() == per_param * numel
    assert optimizer_state_bytes(moments, main_params) == per_param


@pytest.mark.parametrize("main_params", ["fp32", "remainder", "stochastic"])
def test_state_dict_round_trip_continues_bit_for_bit(main_params):
    init, grads = problem(SHAPES, 20)
    whole_opt, whole = run(init, grads, main_params, "bf16")
    first_opt, first = run(init, grads[:10], main_params, "bf16")
    saved = first_opt.state_dict()
    params = [torch.nn.Parameter(p.detach().clone()) for p in first]
    resumed = fresh_optimizer(params, main_params)
    resumed.load_state_dict(saved)
    for key in ("exp_avg", "exp_avg_sq", "master_param"):
        assert resumed.state[params[0]][key].dtype == first_opt.state[first[0]][key].dtype
    continue_steps(resumed, params, grads[10:])
    for a, b in zip(whole, params):
        assert torch.equal(a, b)
    for a, b in zip(masters(whole_opt, whole), masters(resumed, params)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("main_params", ["fp32", "remainder", "stochastic"])
def test_fp32_get_and_set_state_round_trip(main_params):
    """Megatron's checkpoint code reads every state tensor in fp32 (get_unscaled_state) and
    writes it back the same way (set_scaled_state), the master included: a fresh optimizer
    given those continues as the original does."""
    init, grads = problem(SHAPES, 20)
    whole_opt, whole = run(init, grads, main_params, "bf16")
    first_opt, first = run(init, grads[:10], main_params, "bf16")
    fresh = [torch.nn.Parameter(torch.zeros_like(p)) for p in first]
    resumed = fresh_optimizer(fresh, main_params)
    for old, new in zip(first, fresh):
        for key in ("master_param", "exp_avg", "exp_avg_sq"):
            value = first_opt.get_unscaled_state(old, key)
            assert value.dtype == torch.float32
            resumed.set_scaled_state(new, key, value)
        resumed.state[new]["step"].fill_(float(first_opt.state[old]["step"]))
    continue_steps(resumed, fresh, grads[10:])
    for a, b in zip(whole, fresh):
        assert torch.equal(a, b)


def test_parameters_without_gradient_are_left_alone_and_fp32_parameters_need_no_master():
    a = torch.nn.Parameter(torch.ones(8))
    b = torch.nn.Parameter(torch.ones(8))
    opt = MixedPrecisionAdamW([a, b], **HYPER, master_weights=False, kernels="torch")
    a.grad = torch.ones(8)
    opt.step()
    assert b not in opt.state and torch.equal(b, torch.ones(8))
    assert opt.state[a]["master_param"].numel() == 0 and bool((a < 1).all())
    ref = reference([torch.ones(8)], [[torch.ones(8)]])[0]
    torch.testing.assert_close(a.double(), ref, rtol=0, atol=1e-6)


def test_bad_settings_are_refused():
    p = [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]
    with pytest.raises(ValueError, match="main_params"):
        MixedPrecisionAdamW(p, main_params="kahan")
    with pytest.raises(ValueError, match="AdamW"):
        MixedPrecisionAdamW(p, adam_w_mode=False)
    with pytest.raises(ValueError, match="fp32"):
        MixedPrecisionAdamW(p, exp_avg_dtype="fp8")
    with pytest.raises(ValueError, match="master"):
        MixedPrecisionAdamW(p, master_weight_dtype=torch.float16)


def _interpreted(scenario: str) -> dict:
    """Run tests/native/adamw_interpreted.py in a fresh interpreter with TRITON_INTERPRET=1
    (Triton reads it when its language module is imported, so not in this process): the
    Triton kernel on the CPU, the same source the GPU compiles. Returns its measurements."""
    import json
    import os
    import subprocess
    import sys

    from .adamw_reference import REPO

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "tests.native.adamw_interpreted", scenario],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["fp32/fp32", "remainder/bf16", "fp32/bf16",
                                      "remainder/bf16/aligned"])
def test_triton_kernel_tracks_float64_adamw_under_the_interpreter(scenario):
    """The kernel's master against the float64 AdamW (moments rounded to bf16 where stored in
    bf16), within the bounds of the torch path's tests; with bf16 moments it agrees with the
    torch path to the same bound (both round to nearest, ties to even). Sizes cut mid-vector
    take the element-wise accesses, multiples of 8 the vector ones (ALIGNED)."""
    got = _interpreted(scenario)
    assert got["aligned"] == scenario.endswith("/aligned")
    assert got["error"] <= got["bound"]
    assert got["error_vs_torch"] <= got["bound"]


def test_triton_kernel_rebuilds_remainder_masters_under_the_interpreter():
    """In the default run (seconds; the long interpreted runs above are slow): three steps of
    the kernel's remainder mode agree with the torch path to fp32 rounding, with masters whose
    remainders are negative (the bf16 high half rounded up) among them."""
    got = _interpreted("short")
    assert got["negative_remainders"] > got["elements"] // 4
    assert got["error_vs_torch"] <= got["bound"]


@pytest.mark.slow
def test_triton_kernel_rounds_stochastically_without_bias_under_the_interpreter():
    got = _interpreted("stochastic")
    assert abs(got["mean_error_ulp"]) <= got["tolerance_ulp"]
    assert got["distinct_updates"] > 1


def test_vector_alignment_is_declared_only_where_every_tensor_allows_it():
    from training.native.adamw import aligned_for_vectors

    whole = torch.zeros(4096, dtype=torch.bfloat16)
    shifted = whole[1:]                       # 2 bytes past a 16-byte boundary
    assert aligned_for_vectors([whole], [whole[8:]], block=4096)
    assert not aligned_for_vectors([whole], [shifted], block=4096)
    assert not aligned_for_vectors([whole], block=4104)        # blocks not 16-aligned
    assert aligned_for_vectors([whole], [torch.empty(0)], block=4096)   # empty: no access
    assert not aligned_for_vectors([whole[:4092]], block=4096)  # a size the mask cuts mid-vector


def _sm90_ptx(aligned: bool, fp32_states: bool = False) -> str:
    """The kernel compiled for an H100/H200 (sm_90) without a GPU, with the launch's options,
    its pointer arguments 16-byte aligned as Triton's launcher specializes them: the remainder
    mode with bf16 moments, or (fp32_states) fp32 masters and moments."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from training.native import adamw_triton

    pointers = {"p0": "*i16", "g0": "*bf16", "m0": "*bf16", "v0": "*bf16", "x0": "*i16",
                **{f"{k}_offs": "*i64" for k in "pgmvx"}, "numels": "*i64",
                "block_tensor": "*i32", "block_start": "*i64"}
    scalars = {k: "fp32" for k in ("lr", "beta1", "beta2", "eps", "wd", "bc1", "bc2_sqrt")}
    constants = {"P_BYTES": 2, "G_BYTES": 2, "M_BYTES": 2, "V_BYTES": 2, "X_BYTES": 2,
                 "M_BF16": True, "V_BF16": True, "MODE": 2, "BLOCK": 4096, "ALIGNED": aligned}
    if fp32_states:
        pointers.update(p0="*bf16", m0="*fp32", v0="*fp32", x0="*fp32")
        constants.update(M_BYTES=4, V_BYTES=4, X_BYTES=4, M_BF16=False, V_BF16=False, MODE=1)
    signature = {**pointers, **scalars, "seed": "i32", **{k: "constexpr" for k in constants}}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}
    source = ASTSource(fn=adamw_triton.kernel(), signature=signature, constexprs=constants,
                       attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=adamw_triton.LAUNCH_OPTIONS).asm["ptx"]


@pytest.mark.slow
def test_aligned_kernel_moves_16_byte_vectors_on_sm90():
    """The point of ALIGNED: global loads and stores of 16 bytes, not one 2-byte element each
    (what an address read from a table gives; session 8's kernel)."""
    import re

    vectors = {a: len(re.findall(r"(ld|st)\.global[.\w]*\.v4", _sm90_ptx(a)))
               for a in (False, True)}
    # remainder mode: 5 loads and 4 stores of 16 bf16/int16 elements per thread = 2 vectors each
    assert vectors == {False: 0, True: 18}


@pytest.mark.slow
def test_kernel_arithmetic_is_the_same_with_vectors_and_without():
    """fp32 states expose every rounding: with multiply-adds left to the compiler the vector and
    element paths differed in the last bit on the H200 (session 9). The launch's options keep
    each operation rounded on its own (.rn: no contraction), so both paths compute the same
    expression tree, only scheduled differently."""
    from collections import Counter
    import re

    def arithmetic(ptx: str) -> list[str]:
        return re.findall(r"^\s*((?:fma|add|sub|mul|div|sqrt|rcp)\.[\w.]*f32)", ptx, re.M)

    plain, vector = (arithmetic(_sm90_ptx(a, fp32_states=True)) for a in (False, True))
    assert plain and not any(op.startswith("fma") for op in plain)
    assert all(".rn." in op for op in plain if op.split(".")[0] in ("add", "sub", "mul"))
    assert Counter(plain) == Counter(vector)
