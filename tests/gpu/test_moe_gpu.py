"""MoE on the GPU: parity with Hugging Face Qwen3-MoE in bf16 at Qwen3-30B-A3B's width on each
backend and experts implementation, and the tiny MoE preset training through the launcher on
Shakespeare with falling loss and balanced-enough routing."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from training.moe.presets import QWEN3_30B_A3B, TINY_MOE

from tests.model.parity import check_bf16_parity
from tests.moe.model import moe_parity

pytestmark = pytest.mark.gpu

HAVE_TE = importlib.util.find_spec("transformer_engine") is not None
# (backend, kernels, grouped, experts): experts is MOE_EXPERT_IMPL (the TE backend's choice)
CASES = [("native", "liger", True, "native"), ("native", "torch", False, "native"),
         ("local", "torch", False, "native")] + (
    [("transformer_engine", "torch", True, "te"),        # TE's grouped linear
     ("transformer_engine", "liger", True, "native")]    # the native experts beside TE's layers
    if HAVE_TE else [])


def _id(preset, layers, backend, kernels, grouped, experts):
    return (f"{preset.name}-{backend}-{kernels}-"
            f"{(experts + '-grouped') if grouped else 'sequential'}")


PARITY = [*((TINY_MOE, 2, *case) for case in CASES),
          (QWEN3_30B_A3B, 2, "native", "liger", True, "native"),   # the bench's default
          (QWEN3_30B_A3B, 2, "native", "liger", False, "native")]  # the loop over 128 experts
if HAVE_TE:   # TE's default on a TE image at the bench's width
    PARITY.append((QWEN3_30B_A3B, 2, "transformer_engine", "liger", True, "native"))


@pytest.mark.parametrize("preset,layers,backend,kernels,grouped,experts", PARITY,
                         ids=[_id(*case) for case in PARITY])
def test_bf16_parity_with_hf_qwen3_moe(preset, layers, backend, kernels, grouped, experts):
    preset = dataclasses.replace(preset, num_layers=layers)
    module = "TEGroupedMLP" if grouped else "SequentialMLP"

    def prepare(gpt):
        mlp = gpt.decoder.layers[0].mlp.experts
        assert type(mlp).__name__ == module
        if grouped:   # whose grouped linear: the native one holds every expert in one tensor
            assert (getattr(mlp.linear_fc1, "weight", None) is not None) is (experts == "native")

    result = moe_parity(preset, layers, backend, kernels, "cuda", torch.bfloat16, seq=1024,
                        grouped=grouped, prepare=prepare, experts=experts)
    print(f"\n{preset.name}/{backend}/{kernels}/{experts}-{module}: max abs err "
          f"{result['max_abs_err']:.3e}, mean abs err {result['mean_abs_err']:.3e} (HF's own "
          f"bf16 error {result['baseline_abs_err']:.3e}), loss HF {result['loss_hf']:.5f} ours "
          f"{result['loss_ours']:.5f}")
    check_bf16_parity(result)   # within 3x HF's own bf16 error (tests/model/parity.py)
    torch.cuda.empty_cache()


def _tiny_moe_run(tmp_path, name: str, **toggles):
    """30 iterations of the tiny MoE preset (on the native backend unless TRANSFORMER_IMPL is
    given): (run folder, mean loss of iterations 1-5, of 26-30, metrics.jsonl's step rows)."""
    import json

    from tests.gpu.test_train_gpu import _losses, _train

    toggles.setdefault("TRANSFORMER_IMPL", "native")
    run = _train(tmp_path, name, script="examples/moe/train_qwen3_moe.sh", TOTAL_ITERS=30,
                 **toggles)
    losses = _losses(run)
    assert sorted(losses) == list(range(1, 31))
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return (run, sum(losses[i] for i in range(1, 6)) / 5,
            sum(losses[i] for i in range(26, 31)) / 5,
            [m for m in steps if "step_time_s" in m])


def test_tiny_moe_trains_on_shakespeare_with_balanced_routing(tmp_path):
    """The tiny MoE preset (8 experts, top-2) through the launcher on the native backend with its
    defaults (grouped experts on grouped_mm, the native permute): falling loss, and the
    router's load balance in metrics.jsonl every iteration, balanced enough at the end."""
    import json

    run, first, last, steps = _tiny_moe_run(tmp_path, "tiny-moe")
    late = steps[-10:]
    imbalance = sum(m["moe_load_imbalance_mean"] for m in late) / len(late)
    worst = max(m["moe_load_imbalance"] for m in late)
    aux = sum(m["moe_load_balancing_loss"] for m in late) / len(late)
    print(f"\ntiny-moe: loss {first:.3f} -> {last:.3f}; last 10 iterations: tokens per expert "
          f"max/mean {imbalance:.2f} (worst layer {worst:.2f}), aux loss {aux:.3f}")
    assert last < first - 1.0
    assert all(1.0 <= m["moe_load_imbalance"] <= 4.0 for m in steps)   # 4 = experts / top-k
    # balanced enough: below the midpoint (2.5) between uniform routing (1) and a collapse onto
    # the top-k experts (4), and the aux loss near its uniform value (1). The first H200 run
    # (session 9): 2.09, aux 1.067.
    assert imbalance < 2.5 and aux < 1.5
    section = json.loads((run / "manifest.json").read_text())["run"]
    assert section["summary"]["measured"]
    assert "grouped_mm" in section["native"]["experts"]
    assert "atomic-free" in section["native"]["moe_permute"]


def test_tiny_moe_trains_under_a_full_iteration_cuda_graph(tmp_path):
    """CUDA_GRAPH=full_iteration on the tiny MoE preset with the lean step (no host read in the
    step): the run captures after 3 eager iterations and replays; the loss falls like the eager
    run's, and the router statistics keep coming after the capture (the counts are added into
    buffers the graph replays into, training/router_stats.py)."""
    import json

    run, first, last, steps = _tiny_moe_run(tmp_path, "tiny-moe-graph",
                                            CUDA_GRAPH="full_iteration")
    replayed = [m for m in steps if m["iteration"] > 4]
    print(f"\ntiny-moe, CUDA graph: loss {first:.3f} -> {last:.3f}; load imbalance after the "
          f"capture {[round(m['moe_load_imbalance'], 2) for m in replayed[-5:]]}")
    assert last < first - 1.0
    assert len(replayed) == 26
    assert all(1.0 <= m["moe_load_imbalance"] <= 4.0 for m in replayed)
    assert len({round(m["moe_load_imbalance"], 6) for m in replayed}) > 1   # not one frozen value
    manifest = json.loads((run / "manifest.json").read_text())
    rows = {row["toggle"]: row for row in manifest["toggles"]}
    assert rows["CUDA_GRAPH"]["value"] == "full_iteration"
    assert rows["METRICS_WARMUP_ITERS"]["value"] == "6"   # 20% of 30; >= the capture's 4


def test_tiny_moe_under_a_cuda_graph_evaluates_saves_and_resumes(tmp_path):
    """CUDA_GRAPH=full_iteration with evaluation and a checkpoint: Megatron captures a second
    graph for validation (after 3 eager evaluation calls: here at iteration 15's evaluation)
    and the run saves at 10; a resume from 10 captures again after its own eager iterations and
    continues the loss curve, its evaluations agreeing with the uninterrupted run's."""
    import json

    from tests.gpu.test_train_gpu import _losses, _train

    ckpt = tmp_path / "ckpt"
    toggles = dict(TRANSFORMER_IMPL="native", TOTAL_ITERS=20, CUDA_GRAPH="full_iteration",
                   EVAL_INTERVAL=5, EVAL_ITERS=2)
    script = "examples/moe/train_qwen3_moe.sh"
    full = _train(tmp_path, "graph-full", script=script, SAVE=ckpt, SAVE_INTERVAL=10, **toggles)
    assert (ckpt / "latest_checkpointed_iteration.txt").exists()
    resumed = _train(tmp_path, "graph-resumed", "--ckpt-step", "10", script=script, LOAD=ckpt,
                     **toggles)

    def evals(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return {m["iteration"]: m["eval_loss"] for m in rows if "eval_loss" in m}

    a, b = _losses(full), _losses(resumed)
    ea, eb = evals(full), evals(resumed)
    worst = max(abs(a[i] - b[i]) / a[i] for i in range(11, 21))
    print(f"\ntiny-moe, CUDA graph with evaluation: eval loss {ea}; resumed {eb}; worst relative "
          f"train-loss difference over 11-20 after the resume {worst:.2e}")
    assert sorted(a) == list(range(1, 21)) and sorted(b) == list(range(11, 21))
    assert sorted(ea) == [5, 10, 15, 20] and sorted(eb) == [15, 20]
    assert ea[20] < ea[5] - 0.5                        # the replayed steps still learn
    assert worst < 1e-3
    assert all(abs(ea[i] - eb[i]) / ea[i] < 1e-3 for i in (15, 20))


@pytest.mark.skipif(not HAVE_TE, reason="Transformer Engine is not installed")
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_tiny_moe_trains_on_the_te_backend_with_native_experts(tmp_path, precision):
    """The TE backend as auto picks its experts on an H200: TE's attention and dense linears,
    the native grouped experts (MOE_EXPERT_IMPL=auto) with the native permute and the lean
    step; under fp8 the experts stay bf16. The loss falls as on the native backend, and the
    manifest names what ran."""
    import json

    run, first, last, _steps = _tiny_moe_run(tmp_path, f"tiny-moe-te-{precision}",
                                             TRANSFORMER_IMPL="transformer_engine",
                                             PRECISION=precision)
    print(f"\ntiny-moe on TE ({precision}): loss {first:.3f} -> {last:.3f}")
    assert last < first - 1.0
    manifest = json.loads((run / "manifest.json").read_text())
    rows = {row["toggle"]: row for row in manifest["toggles"]}
    assert rows["TRANSFORMER_IMPL"]["value"] == "transformer_engine"
    assert rows["MOE_EXPERT_IMPL"]["value"] == "native"
    parts = manifest["run"]["transformer_engine"]
    assert "grouped_mm" in parts["experts"] and "atomic-free" in parts["moe_permute"]
    assert ("recipe covers" in parts["experts"]) is (precision != "bf16")
