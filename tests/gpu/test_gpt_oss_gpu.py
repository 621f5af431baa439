"""gpt-oss on the GPU: flex attention's compiled kernel with the sink correction against the
fp32 reference, forward and backward (its log-sum-exp differentiated by flex itself); parity with
Hugging Face's GptOssForCausalLM in bf16 (tiny, and gpt-oss-20b's width at 2 layers); the tiny
preset training through examples/moe/train_gpt_oss.sh on Shakespeare with falling loss."""
from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from training.moe.gpt_oss import GPT_OSS_20B, TINY_GPT_OSS
from training.native import flex_attention as fa

from tests.model.parity import check_bf16_parity, report

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("seq", [1000, 4096])
def test_flex_sink_attention_forward_and_backward_against_the_reference(window, seq):
    """gpt-oss-20b's heads (64 / 8 groups of 64) in bf16: flex (compiled) within bf16 noise of
    the fp32 reference, outputs and the gradients of q, k, v and the sinks; an odd length too.
    q, k and v in the layout FlexSinkAttention hands them over in a run: Megatron's [s, b, h, d]
    permuted to [b, h, s, d] (not contiguous)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_q, shape_kv = (1, 64, seq, 64), (1, 8, seq, 64)
    q, k, v = (torch.randn(seq, 1, heads, 64, device="cuda", generator=gen,
                           dtype=torch.bfloat16).permute(1, 2, 0, 3) for heads in (64, 8, 8))
    assert q.shape == shape_q and k.shape == shape_kv and not q.is_contiguous()
    sinks = torch.randn(64, device="cuda", generator=gen, dtype=torch.bfloat16)
    grad = torch.randn(shape_q, device="cuda", generator=gen, dtype=torch.bfloat16)
    results = []
    for impl in ("flex", "reference"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
        out = fa.sink_attention(*leaves, window, 0.125, impl=impl)
        out.backward(grad)
        results.append([out.float(), *(t.grad.float() for t in leaves)])
    for name, ours, ref in zip(("out", "dq", "dk", "dv", "dsinks"), *results):
        err = (ours - ref).abs().max().item()
        scale = ref.abs().max().item()
        print(f"\nseq {seq} window {window} {name}: max abs err {err:.3e} (max |ref| {scale:.3e})")
        assert err <= 2e-2 * max(scale, 1.0), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clamped_geglu_kernel_against_megatrons_function(dtype):
    """The Triton clamped quick-GeGLU (training/native/clamped_geglu.py) against megatron-core's
    weighted_bias_quick_geglu_impl on CUDA at gpt-oss-20b's expert width (F 2880), values
    beyond the clamp and on its bounds: output, input and routing-weight gradients."""
    from tests.moe.test_gpt_oss_experts import clamp_probe, geglu_against_megatron

    results = geglu_against_megatron(*(t.cuda() for t in clamp_probe(4099, 2880, dtype)))
    for name, ours, ref in zip(("out", "dx", "dw"), results[1], results[0]):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, name
        err = (ours.float() - ref.float()).abs().max().item()
        scale = ref.float().abs().max().item()
        print(f"\n{dtype} {name}: max abs err {err:.3e} (max |ref| {scale:.3e})")
        assert err <= (1e-5 if dtype == torch.float32 else 1e-2) * max(scale, 1.0), name
    dx = results[1][1]
    assert (dx[0, [2, 2880 + 2, 2880 + 3]] == 0).all() and (dx[0, [0, 1, 2880]] != 0).all()


@pytest.mark.parametrize("weighted", [False, True])
def test_expert_bias_kernels_against_autograds_gather(weighted):
    """ExpertBias's Triton forward and probabilities' gradient (training/native/expert_bias.py)
    against autograd through `x + bias[rows] (* probs)` in fp32 on CUDA (ours in bf16, the
    dtypes a run has: bf16 x and bias, fp32 probabilities) at gpt-oss-20b's fc1 width
    (5,760), the tokens per expert on the GPU (MOE_DEVICE_COUNTS), an expert without rows."""
    from training.native.grouped_experts import DeviceCounts, add_expert_bias

    gen = torch.Generator(device="cuda").manual_seed(0)
    counts = torch.tensor([700, 0, 1500, 33, 1], device="cuda")
    rows, width = int(counts.sum()), 5760
    x = torch.randn(rows, width, device="cuda", generator=gen, dtype=torch.bfloat16)
    bias = torch.randn(len(counts), width, device="cuda", generator=gen, dtype=torch.bfloat16)
    probs = torch.rand(rows, 1, device="cuda", generator=gen) if weighted else None
    grad = torch.randn(rows, width, device="cuda", generator=gen, dtype=torch.bfloat16)
    leaves = [x, bias] + ([probs] if weighted else [])
    ours_in = [t.clone().requires_grad_() for t in leaves]
    out = add_expert_bias(ours_in[0], ours_in[1], DeviceCounts(counts),
                          ours_in[2] if weighted else None)
    out.backward(grad)
    # the reference in fp32 from the same bf16 values (against autograd's bf16 gather backward
    # the bias gradient differed by 7% of its largest sum, 1,500 rows an expert: the fp32
    # reference settles which is right)
    ref_in = [t.float().clone().requires_grad_() for t in leaves]
    index = torch.repeat_interleave(torch.arange(len(counts), device="cuda"), counts)
    gathered = ref_in[1][index]
    ref = ref_in[0] + (gathered * ref_in[2] if weighted else gathered)
    ref.backward(grad.float())
    for name, a, b in zip(("out", "dx", "dbias", "dprobs"), [out] + [t.grad for t in ours_in],
                          [ref] + [t.grad for t in ref_in]):
        assert a.shape == b.shape, name
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        print(f"\nweighted={weighted} {name}: max abs err {err:.3e} (max |ref| {scale:.3e})")
        assert err <= 1e-2 * max(scale, 1.0), name
    assert ours_in[1].grad[1].abs().max() == 0


HAVE_TE = importlib.util.find_spec("transformer_engine") is not None
# gpt-oss's MoE block on the TE backend is known to part from HF (session 18, layer 0's MLP on
# TE 2.20.2; te_moe_blocker keeps it off TE): strict, so a TE that fixes it fails this mark, and
# then the blocker is lifted
TE_MOE_BLOCK = pytest.mark.xfail(strict=True, reason="gpt-oss's MoE block on the TE backend "
                                 "parts from HF (training.launch.toggles.te_moe_blocker)")
PARITY = [(TINY_GPT_OSS, 2, 1024, "native"),
          (dataclasses.replace(GPT_OSS_20B, vocab_size=8192), 2, 1024, "native")] + (
    [pytest.param(TINY_GPT_OSS, 2, 1024, "transformer_engine", marks=TE_MOE_BLOCK)]
    if HAVE_TE else [])


@pytest.mark.parametrize("preset,layers,seq,backend", PARITY,
                         ids=["tiny", "20b-width-2-layers", "tiny-te"][:len(PARITY)])
def test_bf16_parity_with_hf_gpt_oss(preset, layers, seq, backend):
    """Native: flex attention; TE (where installed): TE's fused attention with
    softmax_type learnable and the window, the native grouped experts beside it."""
    from tests.moe.gpt_oss_model import gpt_oss_parity

    result, _, _ = gpt_oss_parity(preset, layers, "cuda", torch.bfloat16, batch=1, seq=seq,
                                  backend=backend)
    report(f"{preset.name}/{backend}/bf16/cuda", result)
    check_bf16_parity(result)
    torch.cuda.empty_cache()


@pytest.mark.skipif(not HAVE_TE, reason="Transformer Engine is not installed")
def test_te_attention_with_sinks_and_window_matches_hf():
    """Layer 0 of the tiny preset on the TE backend (the banded layer: TE's fused attention
    with softmax_type learnable and the window): its attention's output against HF's on the
    same tokens, in bf16. Session 18 measured a mean error of 7e-5 on outputs of mean 0.080
    (max 0.002) here, while the MoE block after it parted (mean 0.078 on 0.060)."""
    from tests.moe.gpt_oss_model import gpt_oss_parity, layer_errors

    _, gpt, hf_model = gpt_oss_parity(TINY_GPT_OSS, 2, "cuda", torch.bfloat16, batch=1,
                                      seq=1024, backend="transformer_engine")
    rows = layer_errors(gpt, hf_model, TINY_GPT_OSS.vocab_size, 1024, "cuda")
    for row in rows:
        print(row)
    attention = rows[0]
    assert attention["part"] == "attn" and attention["layer"] == 0
    assert attention["mean_abs_err"] <= 0.01 * attention["mean_abs"], attention
    torch.cuda.empty_cache()


def test_tiny_gpt_oss_trains_on_shakespeare(tmp_path):
    """The tiny gpt-oss preset through its entry script on the native backend (flex attention
    with the sinks and the 16-key window, biased grouped experts, the lean step): falling loss."""
    from tests.gpu.test_train_gpu import _losses, _train

    # flex attention's first compile (forward and backward, both windows) on top of a tiny
    # run's ~45 s: more than the dense runs' limit
    run = _train(tmp_path, "tiny-gpt-oss", script="examples/moe/train_gpt_oss.sh",
                 timeout_s=240, TRANSFORMER_IMPL="native", TOTAL_ITERS=30)
    losses = _losses(run)
    first = sum(losses[i] for i in range(1, 6)) / 5
    last = sum(losses[i] for i in range(26, 31)) / 5
    print(f"\ntiny-gpt-oss: loss {first:.3f} -> {last:.3f}")
    assert last < first - 1.0
    native = json.loads((run / "manifest.json").read_text())["run"]["native"]
    assert "flex attention" in native["attention"]
