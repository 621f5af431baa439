"""The memory estimator: its terms, and its error against measured H200 peaks."""
from __future__ import annotations

import pytest

from training.optimize import calibration
from training.optimize.config import flce, from_manifest
from training.optimize.inputs import load_run
from training.optimize.memory import GIB, MEMORY_BOUND_FRACTION, estimate

from .helpers import (CPU_OFFLOAD, FULL_32L, FULL_32L_OPT_BF16, FULL_32L_RECOMPUTE, LOCAL,
                      NATIVE, OPT_BF16, OPT_BF16_SR, PHASES, PHASES_RECOMPUTE, PROFILED)

OPTIMIZER_STATE_RUNS = [OPT_BF16, OPT_BF16_SR, FULL_32L_OPT_BF16]

# The error this estimator honestly reaches on the recorded runs (the goal is 15%).
PEAK_TOLERANCE_PCT = 5.0
AFTER_STEP_TOLERANCE_PCT = 1.0


@pytest.mark.parametrize("run", [NATIVE, LOCAL, PROFILED, FULL_32L, FULL_32L_RECOMPUTE, PHASES,
                                 PHASES_RECOMPUTE, *OPTIMIZER_STATE_RUNS], ids=lambda p: p.name)
def test_estimate_against_recorded_peak(run):
    row = calibration.calibrate(run)
    print(f"\n{run.name}: estimated {row['estimated_peak_gib']:.2f} GiB, measured "
          f"{row['measured_peak_gib']:.2f} GiB, error {row['error_pct']:+.2f}%")
    assert row["measured_from"].startswith("manifest.json run.summary")
    assert abs(row["error_pct"]) <= PEAK_TOLERANCE_PCT
    assert row["within_goal"]


@pytest.mark.parametrize("run", [NATIVE, LOCAL, FULL_32L, FULL_32L_RECOMPUTE,
                                 *OPTIMIZER_STATE_RUNS, CPU_OFFLOAD], ids=lambda p: p.name)
def test_weights_and_optimizer_terms_against_memory_after_a_step(run):
    """After the optimizer step the activations are gone: what is left is the static terms,
    the fp32 gradient copy and persistent buffers (measured: metrics.jsonl mem_allocated_gib)."""
    row = calibration.calibrate(run)
    after = row["after_step"]
    print(f"\n{run.name} after a step: estimated {after['estimated_gib']:.2f} GiB, measured "
          f"{after['measured_gib']:.2f} GiB, error {after['error_pct']:+.2f}%")
    assert abs(after["error_pct"]) <= AFTER_STEP_TOLERANCE_PCT


def test_cpu_offload_peak_within_the_goal_with_its_fixed_residual():
    """Megatron's CPU offload: the state terms hold after a step (test above); the peak is
    within the issue's goal, not the 5% of the others: the estimate's fixed forward/backward
    residual (~1.5 GiB at this shape, docs/optimize.md) is 7% of a 20.6 GiB peak."""
    row = calibration.calibrate(CPU_OFFLOAD)
    assert row["within_goal"] and row["error_pct"] > 0
    fb = row["phases"]["forward/backward"]
    assert 1.0 < fb["estimated_gib"] - fb["measured_gib"] < 2.0


@pytest.mark.parametrize("run", [PHASES, PHASES_RECOMPUTE, *OPTIMIZER_STATE_RUNS],
                         ids=lambda p: p.name)
def test_each_phase_estimate_against_its_recorded_peak(run):
    """Runs that split the peak at the optimizer step: the forward/backward and the step
    estimates are each checked against their own measured peak, not only the larger one."""
    row = calibration.calibrate(run)
    assert set(row["phases"]) == {"forward/backward", "optimizer step"}
    for label, e in row["phases"].items():
        print(f"\n{run.name} {label}: estimated {e['estimated_gib']:.2f} GiB, measured "
              f"{e['measured_gib']:.2f} GiB, error {e['error_pct']:+.2f}%")
        assert abs(e["error_pct"]) <= PEAK_TOLERANCE_PCT
    # the run's peak is the larger phase (the between-steps window holds no more than the step)
    measured = load_run(run).measured_phase_peaks_gib()
    assert row["measured_peak_gib"] == max(measured.values())


def test_full_recompute_lowers_the_forward_backward_peak_not_the_step():
    plain, full = calibration.calibrate(PHASES), calibration.calibrate(PHASES_RECOMPUTE)
    fb, step = "forward/backward", "optimizer step"
    assert full["phases"][fb]["measured_gib"] < plain["phases"][fb]["measured_gib"] - 4
    assert full["phases"][step]["measured_gib"] == pytest.approx(
        plain["phases"][step]["measured_gib"], abs=0.01)
    # and the estimate moves the same way
    assert full["phases"][fb]["estimated_gib"] < plain["phases"][fb]["estimated_gib"] - 4


def test_a_run_without_phases_has_none():
    assert "phases" not in calibration.calibrate(NATIVE)
    assert load_run(NATIVE).measured_phase_peaks_gib() == {}


def test_calibration_cli_prints_each_run(capsys):
    assert calibration.main([str(NATIVE), str(LOCAL)]) == 0
    out = capsys.readouterr().out
    assert "h200_l8_native:" in out and "h200_l8_local:" in out
    assert "MISSES THE GOAL" not in out


def _native():
    return from_manifest(load_run(NATIVE).manifest)


def test_parameter_count_of_the_8_layer_run():
    est = estimate(_native())
    # 8 layers of Llama3-8B (1.745B) + untied input and output embeddings (1.051B)
    assert est.params_on_rank == pytest.approx(2.7956e9, rel=1e-3)


def test_fp32_gradient_buffer_doubles_the_gradient_term_and_drops_the_step_copy():
    c = _native()
    bf16, fp32 = estimate(c), estimate(c.with_values(GRAD_REDUCE_IN_BF16=False))
    assert fp32.term("grads").gib == pytest.approx(2 * bf16.term("grads").gib)
    assert bf16.term("step_fp32_grads") is not None
    assert fp32.term("step_fp32_grads") is None
    assert fp32.fwd_bwd_gib > bf16.fwd_bwd_gib


def test_distributed_optimizer_shards_main_params_and_moments_over_dp():
    c = _native().with_values(GPUS_PER_NODE=8)
    sharded = estimate(c)
    replicated = estimate(c.with_values(DISTRIBUTED_OPTIMIZER=False))
    assert c.layout.dp == 8
    assert replicated.term("adam").gib == pytest.approx(8 * sharded.term("adam").gib)
    assert replicated.term("main_params").gib == pytest.approx(8 * sharded.term("main_params").gib)
    assert replicated.term("weights").gib == pytest.approx(sharded.term("weights").gib)


@pytest.mark.parametrize("cp", [2, 4])
def test_distributed_optimizer_shards_over_dp_times_cp(cp):
    """Megatron's distributed optimizer shards over the data-parallel ranks with the context-
    parallel ones (DP x CP): at 8 GPUs each rank holds 1/8 of the state, whatever CP is."""
    c = _native().with_values(GPUS_PER_NODE=8, NUM_LAYERS=32)
    at_cp = estimate(c.with_values(CP=cp))
    assert c.with_values(CP=cp).layout.dp == 8 // cp
    per_rank = at_cp.params_on_rank / 8
    assert at_cp.term("adam").gib == pytest.approx(per_rank * 8 / GIB)
    assert at_cp.term("main_params").gib == pytest.approx(per_rank * 4 / GIB)
    assert at_cp.term("adam").gib == pytest.approx(estimate(c).term("adam").gib)


def test_fused_linear_cross_entropy_avoids_the_logits():
    c = _native()
    fused = estimate(c)
    logits = estimate(c.with_values(CROSS_ENTROPY_LOSS_FUSION=False))
    assert flce(c) and not flce(c.with_values(CROSS_ENTROPY_LOSS_FUSION=False))
    assert "fused linear CE" in fused.term("loss").formula
    assert "logits" in logits.term("loss").formula
    # bf16 + fp32 logits of 8192 tokens x 128256 vocab, and the fp32 part kept
    tokens, vocab = 8192, c.model.padded_vocab(1)
    assert logits.term("loss").gib * GIB >= tokens * vocab * 6
    assert fused.term("loss").gib < logits.term("loss").gib
    # at TP=2 the native backend falls back to Megatron's vocab-parallel loss
    assert not flce(c.with_values(TP=2, GPUS_PER_NODE=2))


def test_local_backend_scores_grow_with_the_square_of_the_sequence():
    c = _native()
    local = c.with_values(TRANSFORMER_IMPL="local")
    def act(cfg):
        return estimate(cfg).term("activations").gib
    assert act(local.with_values(SEQ_LENGTH=16384)) / act(local) > 3.0      # s * s^2 -> ~4x
    assert act(c.with_values(SEQ_LENGTH=16384)) / act(c) == pytest.approx(2.0, rel=1e-6)
    assert estimate(local).term("scores_buffer") is not None
    assert estimate(c).term("scores_buffer") is None


def test_recompute_modes_order_the_activations():
    def activations(c):
        return [estimate(c.with_values(RECOMPUTE=m)).term("activations").gib
                for m in ("none", "selective", "full")]

    c = _native()
    none, selective, full = activations(c)
    # at MBS 1 SDPA keeps no probabilities and the output projection's input is a view of
    # SDPA's output: selective recompute has nothing to drop (measured: levers-recompute's
    # RECOMPUTE=selective left the peak unchanged)
    assert full < selective == none
    assert full == pytest.approx(8 * 8192 * 2 * 4096 / GIB)
    # at MBS 2 the output projection keeps its own [s,b,h] copy, which selective drops
    none, selective, full = activations(c.with_values(MBS=2))
    assert full < selective < none


def test_tensor_parallel_with_sequence_parallel_halves_the_activations():
    c = _native().with_values(GPUS_PER_NODE=2)
    tp2 = c.with_values(TP=2)
    assert tp2["SEQUENCE_PARALLEL"]
    assert (estimate(tp2).term("activations").gib
            == pytest.approx(estimate(c).term("activations").gib / 2))


def test_pipeline_first_stage_holds_pp_micro_batches():
    c = _native().with_values(GPUS_PER_NODE=4, PP=4, BS=16)
    est = estimate(c)
    assert est.stage == "first"
    assert "x 4 micro-batches in flight" in est.term("activations").formula


def test_fits_is_the_90_percent_line():
    c = _native()
    est = estimate(c)
    assert est.device_gib == 141
    assert est.fits is (est.peak_gib <= MEMORY_BOUND_FRACTION * 141)
    big = estimate(c.with_values(SEQ_LENGTH=262144))
    assert big.fits is False


def test_docs_table_is_the_generated_one():
    from .helpers import REPO

    table = calibration.markdown([calibration.calibrate(REPO / r)
                                  for r in calibration.DEFAULT_RUNS])
    assert table in (REPO / "docs" / "optimize.md").read_text(), \
        "docs/optimize.md is stale: paste `python -m training.optimize.calibration --markdown`"


def test_the_advisor_report_calibrates_each_recorded_phase():
    from .helpers import advise

    cal = advise(PHASES)["memory"]["calibration"]
    row = calibration.calibrate(PHASES)
    assert cal["phases"] == row["phases"]
    assert advise(NATIVE)["memory"]["calibration"]["phases"] == {}


# -- optimizer state (ADAM_MOMENTS_DTYPE, MASTER_WEIGHTS, OPTIMIZER_CPU_OFFLOAD) ---------------

def _native_run(**values):
    return from_manifest(load_run(NATIVE).manifest).with_values(**values)


@pytest.mark.parametrize("moments,master,per_param", [
    ("fp32", "fp32", 12), ("bf16", "fp32", 8), ("bf16", "remainder", 6), ("bf16", "stochastic", 4),
    ("fp32", "remainder", 10)])
def test_optimizer_state_terms_follow_the_state_dtypes(moments, master, per_param):
    """The precision-aware optimizer's state per parameter (what MixedPrecisionAdamW holds:
    tests/native/test_adamw.py counts its tensors) and no fp32 gradient copy at the step."""
    from training.optimize.config import precision_aware

    default = estimate(_native_run())
    run = _native_run(ADAM_MOMENTS_DTYPE=moments, MASTER_WEIGHTS=master)
    est = estimate(run)
    state = est.term("main_params").gib + est.term("adam").gib
    assert state * GIB == pytest.approx(est.params_on_rank * per_param, rel=1e-9)
    if precision_aware(run):
        assert est.term("step_fp32_grads") is None and est.term("step_adam_tmp") is None
        saved = default.term("main_params").gib + default.term("adam").gib - state
        assert default.step_gib - est.step_gib == pytest.approx(
            saved + default.term("step_fp32_grads").gib)
    else:
        assert est.term("step_fp32_grads") is not None


def test_the_torch_path_of_the_native_optimizer_adds_its_bounded_scratch():
    est = estimate(_native_run(ADAM_MOMENTS_DTYPE="bf16", NATIVE_KERNELS="torch"))
    assert est.term("step_adam_tmp").gib == pytest.approx(5 * 4 * 2 ** 24 / GIB)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_cpu_offload_keeps_the_gpu_part_and_notes_the_host_memory(fraction):
    est = estimate(_native_run(OPTIMIZER_CPU_OFFLOAD=True, OPTIMIZER_OFFLOAD_FRACTION=fraction))
    assert est.term("adam") is None
    assert est.term("main_params").gib * GIB == pytest.approx(
        est.params_on_rank * 16 * (1 - fraction))
    assert any("pinned host memory" in note for note in est.notes)


def test_full_llama3_8b_on_one_h200_fits_only_with_lighter_state():
    """The issue's launch (seq 8192, one H200): Megatron's fp32 state does not fit; bf16
    moments with 16-bit-remainder masters do (estimate)."""
    full = _native_run(NUM_LAYERS=32).with_platform("h200")
    assert not estimate(full).fits
    assert estimate(full.with_values(ADAM_MOMENTS_DTYPE="bf16", MASTER_WEIGHTS="remainder")).fits
