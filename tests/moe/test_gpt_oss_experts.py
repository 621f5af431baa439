"""gpt-oss's experts on the native grouped linears: biased fc1 and fc2 and the clamped SwiGLU
(Megatron's quick_geglu with glu_linear_offset 1 and activation_func_clamp_value 7), against a
plain autograd reference of gpt-oss's expert (forward and backward) and Megatron's SequentialMLP
with the same weights and biases (forward: its backward with biases raises in megatron-core
0.19.2, an in-place add on a custom Function's output, so the launch refuses MOE_GROUPED_GEMM=0
for gpt-oss); the biases with the tokens per expert on the device (MOE_DEVICE_COUNTS) bit for
bit those with host counts; the checkpoint's bias tensors those SequentialMLP saves."""
from __future__ import annotations

import pytest
import torch

from training.native import grouped_experts
from training.native.clamped_geglu import WeightedClampedQuickGeGLU, clamped_geglu_replacement
from training.native.grouped_experts import DeviceCounts

from tests.model.parity import init_single_rank
from tests.moe.test_grouped_experts import _dense

COUNTS = [3, 0, 7, 5, 1, 9]


def gpt_oss_expert_config(experts: int, hidden: int, ffn: int, fusion: bool = False):
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=2 * ffn, num_attention_heads=4,
        gated_linear_unit=True, activation_func=quick_gelu, glu_linear_offset=1.0,
        activation_func_clamp_value=7.0, add_bias_linear=True, bias_activation_fusion=fusion,
        bias_dropout_fusion=False, use_cpu_initialization=True,
        gradient_accumulation_fusion=False, num_moe_experts=experts, moe_router_topk=2,
        moe_ffn_hidden_size=ffn)


def biased_pair(config, impl="loop"):
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP

    init_single_rank("cpu")
    torch.manual_seed(0)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    n = config.num_moe_experts
    sequential = SequentialMLP(n, config, MLPSubmodules(
        linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear), pg_collection=groups)
    grouped = grouped_experts.grouped_experts_builder(impl, bias=True)(
        n, config, pg_collection=groups)
    with torch.no_grad():
        for i, expert in enumerate(sequential.local_experts):
            # weights large enough that the clamp at 7 bites on some rows
            expert.linear_fc1.weight.normal_(0, 2.0)
            expert.linear_fc1.bias.normal_(0, 1.0)
            expert.linear_fc2.bias.normal_(0, 1.0)
            grouped.linear_fc1.weight[i].copy_(expert.linear_fc1.weight)
            grouped.linear_fc2.weight[i].copy_(expert.linear_fc2.weight)
            grouped.linear_fc1.bias[i].copy_(expert.linear_fc1.bias)
            grouped.linear_fc2.bias[i].copy_(expert.linear_fc2.bias)
    return sequential, grouped


def forward_backward(module, x, probs, grad, tokens):
    module.zero_grad(set_to_none=True)
    xi, pi = x.clone().requires_grad_(), probs.clone().requires_grad_()
    out, bias = module(xi, tokens, pi)
    assert bias is None   # the experts module added it
    out.backward(grad)
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    return out.detach(), xi.grad, pi.grad, grads


def inputs(hidden, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = sum(COUNTS)
    return (torch.randn(n, hidden, generator=gen), torch.rand(n, generator=gen),
            torch.randn(n, hidden, generator=gen))


def reference_experts(x, probs, w1, b1, w2, b2, counts, alpha=1.702, limit=7.0):
    """gpt-oss's expert, written out (Hugging Face's GptOssExperts with gate and up as halves
    instead of interleaved): clamp, gate * sigmoid(alpha gate) * (up + 1), the routing weight on
    the expert's whole output, its fc2 bias included."""
    outs = []
    for e, part in enumerate(torch.split(x, counts)):
        h = part @ w1[e].T + b1[e]
        gate, up = h.chunk(2, dim=-1)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        act = gate * torch.sigmoid(alpha * gate) * (up + 1)
        outs.append((act @ w2[e].T + b2[e]) * probs[sum(counts[:e]):sum(counts[:e + 1]), None])
    return torch.cat(outs)


@pytest.mark.parametrize("impl", ["loop", "grouped_mm"])
@pytest.mark.parametrize("fusion", [False, True, "native"])
def test_biased_clamped_experts_match_the_reference(impl, fusion, monkeypatch):
    """fusion: Megatron's unfused activation, its fused one, or ours in its place (the patch
    table's native_clamped_geglu)."""
    if fusion == "native":
        from megatron.core.transformer.moe import experts

        monkeypatch.setattr(experts, "weighted_bias_quick_geglu_impl", clamped_geglu_replacement(
            experts.weighted_bias_quick_geglu_impl, None))
    config = gpt_oss_expert_config(len(COUNTS), 16, 8, fusion=bool(fusion))
    sequential, grouped = biased_pair(config, impl)
    assert type(grouped).__name__ == "BiasedGroupedMLP"
    x, probs, grad = inputs(16)
    ours = forward_backward(grouped, x, probs, grad, torch.tensor(COUNTS))
    params = [grouped.get_parameter(n).detach().clone().requires_grad_() for n in (
        "linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias")]
    xi, pi = x.clone().requires_grad_(), probs.clone().requires_grad_()
    ref = reference_experts(xi, pi, *params, COUNTS)
    ref.backward(grad)
    assert (ref.detach().abs() > 0).all()
    for a, b, name in zip(ours[:3], (ref.detach(), xi.grad, pi.grad), ("out", "dx", "dprobs")):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    for param, name in zip(params, ("linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight",
                                    "linear_fc2.bias")):
        torch.testing.assert_close(ours[3][name], param.grad, rtol=1e-5, atol=1e-5, msg=name)
    # an expert without tokens: zero gradients for its biases too
    assert ours[3]["linear_fc2.bias"][1].abs().max() == 0
    # Megatron's SequentialMLP (forward; see the module's note) gives the same output unfused;
    # fused, its MLP clamps fc1's output before adding fc1's bias (skip_bias_add), which
    # TEGroupedMLP, whose fc1 adds the bias itself, does not
    with torch.no_grad():
        seq_out, _ = sequential(x, torch.tensor(COUNTS), probs)
    if not fusion:
        torch.testing.assert_close(ours[0], seq_out, rtol=1e-5, atol=1e-5)
    else:
        assert not torch.allclose(ours[0], seq_out, rtol=1e-3, atol=1e-3)
    # the clamp bit: some gate or up pre-activation beyond 7
    with torch.no_grad():
        pre = torch.cat([p @ params[0][e].T + params[1][e]
                         for e, p in enumerate(torch.split(x, COUNTS))])
    assert (pre.abs() > 7).any()


def test_sequential_mlp_with_biases_cannot_train_in_megatron():
    """Why MOE_GROUPED_GEMM=0 is refused for gpt-oss (guard gpt_oss_kernels): this fails when
    Megatron fixes it, and the guard can go."""
    config = gpt_oss_expert_config(len(COUNTS), 16, 8)
    sequential, _ = biased_pair(config)
    x, probs, grad = inputs(16)
    with pytest.raises(RuntimeError, match="view and is being modified inplace"):
        forward_backward(sequential, x, probs, grad, torch.tensor(COUNTS))


def test_the_biases_matter():
    """Zeroing fc2's bias (or dropping the routing weight on it) changes the output: the test
    above would see a bias left out."""
    config = gpt_oss_expert_config(len(COUNTS), 16, 8)
    sequential, grouped = biased_pair(config)
    x, probs, grad = inputs(16)
    tokens = torch.tensor(COUNTS)
    out = forward_backward(grouped, x, probs, grad, tokens)[0]
    with torch.no_grad():
        grouped.linear_fc2.bias.zero_()
    assert not torch.allclose(forward_backward(grouped, x, probs, grad, tokens)[0], out)


def test_device_counts_give_the_host_counts_results_bit_for_bit():
    config = gpt_oss_expert_config(len(COUNTS), 16, 8)
    _, grouped = biased_pair(config)
    x, probs, grad = inputs(16, seed=3)
    host = forward_backward(grouped, x, probs, grad, torch.tensor(COUNTS))
    device = forward_backward(grouped, x, probs, grad, DeviceCounts(torch.tensor(COUNTS)))
    for a, b in zip(host[:3], device[:3]):
        assert torch.equal(a, b)
    for name in host[3]:
        assert torch.equal(host[3][name], device[3][name]), name


def test_checkpoint_holds_the_bias_tensors_sequential_mlp_saves():
    config = gpt_oss_expert_config(4, 16, 8)
    sequential, grouped = biased_pair(config)
    prefix = "decoder.layers.0.mlp.experts."
    ref = _dense(sequential.sharded_state_dict(prefix=prefix))
    ours = _dense(grouped.sharded_state_dict(prefix=prefix))
    assert set(ours) == set(ref) == {f"{prefix}experts.linear_fc{i}.{kind}"
                                     for i in (1, 2) for kind in ("weight", "bias")}
    for key, tensor in ref.items():
        assert not tensor.isnan().any() and not ours[key].isnan().any(), key
        torch.testing.assert_close(ours[key], tensor, rtol=0, atol=0)


def test_bias_free_experts_keep_megatrons_module():
    assert grouped_experts.grouped_experts_builder("loop").keywords["bias"] is False
    assert grouped_experts.grouped_experts_builder("loop", bias=True).keywords["bias"] is True
    assert grouped_experts.biased_grouped_mlp() is grouped_experts.biased_grouped_mlp()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_bias_backward_sums_each_experts_rows_like_autograds_gather(weighted, dtype):
    """add_expert_bias (one GEMM per backward) against autograd through `bias[rows]` (the
    index_put backward it replaces), with an expert that gets no row."""
    counts = [3, 0, 5, 2]
    torch.manual_seed(0)
    x = torch.randn(sum(counts), 6, dtype=dtype, requires_grad=True)
    bias = torch.randn(len(counts), 6, dtype=dtype, requires_grad=True)
    probs = torch.rand(sum(counts), 1, requires_grad=True) if weighted else None
    grad = torch.randn(sum(counts), 6, dtype=dtype)
    out = grouped_experts.add_expert_bias(x, bias, counts, probs)
    assert type(out.grad_fn).__name__ == "ExpertBiasBackward"
    ours = torch.autograd.grad(out, [x, bias] + ([probs] if weighted else []), grad)
    rows = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    ref_out = x + (bias[rows] * probs if weighted else bias[rows])
    ref_out = ref_out.to(dtype)
    refs = torch.autograd.grad(ref_out, [x, bias] + ([probs] if weighted else []), grad)
    tol = dict(rtol=0, atol=0) if dtype == torch.float32 and not weighted else \
        dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, ref_out, **tol)
    for a, b in zip(ours, refs):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, **tol)
    assert ours[1][1].abs().max() == 0    # the expert without rows gets no gradient


def clamp_probe(rows: int, f: int, dtype, seed: int = 0):
    """fc1 outputs with values beyond the clamp both ways and exactly on its bounds, routing
    weights [rows, 1] in fp32 (Megatron's router dtype), and an output gradient."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2 * f, generator=gen) * 6
    x[0, :4] = torch.tensor([7.0, -7.0, 7.5, -9.0])
    x[0, f:f + 4] = torch.tensor([7.0, -7.0, 7.5, -9.0])
    return (x.to(dtype), torch.rand(rows, 1, generator=gen),
            torch.randn(rows, f, generator=gen).to(dtype))


def geglu_against_megatron(x, w, dy):
    """(output, dx, dw) of megatron-core's weighted_bias_quick_geglu_impl, then of ours in its
    place (gpt-oss's offset 1 and clamp 7), forward and backward on the same inputs."""
    from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl

    results = []
    for fn in (weighted_bias_quick_geglu_impl,
               clamped_geglu_replacement(weighted_bias_quick_geglu_impl, None)):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xi, None, wi, False, 1.0, 7.0)
        out.backward(dy)
        results.append((out.detach(), xi.grad, wi.grad))
    assert type(out.grad_fn).__name__ == "WeightedClampedQuickGeGLUBackward"
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clamped_geglu_matches_megatrons_weighted_quick_geglu(dtype):
    """Our clamped quick-GeGLU (its torch formulas, which the Triton kernel repeats: tests/gpu/)
    against megatron-core's weighted_bias_quick_geglu_impl through autograd: output, input and
    routing-weight gradients, the clamp's bounds passing gradient as torch's clamp does."""
    (ref, ref_dx, ref_dw), (ours, dx, dw) = geglu_against_megatron(*clamp_probe(12, 40, dtype))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for a, b in ((ours, ref), (dx, ref_dx), (dw, ref_dw)):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **tol)
    assert (dx[0, [2, 40 + 2, 40 + 3]] == 0).all()       # clamped: no gradient
    assert (dx[0, [0, 40, 41]] != 0).all()                # on the bounds: passes
    assert (dx[0, [1, 3]] != 0).all()                     # the gate has no lower clamp


def test_clamped_geglu_defers_to_megatron_where_it_has_no_kernel():
    calls = []

    def original(*args):
        calls.append(args)
        return "megatron's"

    fn = clamped_geglu_replacement(original, None)
    x, w, _ = clamp_probe(2, 4, torch.float32)
    assert fn(x, torch.zeros(8), w, False, 1.0, 7.0) == "megatron's"     # a bias
    assert fn(x, None, w, True, 1.0, 7.0) == "megatron's"                # fp8 input store
    assert fn(x, None, w, False, 1.0, None) == "megatron's"              # no clamp
    assert len(calls) == 3
    out = fn(x.view(2, 1, 8), None, w, False, 1.0, 7.0)
    assert out.shape == (2, 1, 4) and out.grad_fn is None    # no grad asked: plain tensor
    xi = x.clone().requires_grad_()
    assert type(fn(xi, None, w, False, 1.0, 7.0).grad_fn).__name__ == \
        "WeightedClampedQuickGeGLUBackward"
    assert WeightedClampedQuickGeGLU.apply(x, w, 7.0, 1.0, 1.702).shape == (2, 4)


def test_the_clamped_geglu_patch_applies_to_clamped_quick_geglu_moe_only():
    """native_clamped_geglu goes in for an MoE run with the clamped quick-GeGLU (gpt-oss, any
    backend: the grouped experts call it), not for one without the clamp or without experts;
    applied, Megatron's experts module calls ours; restored, Megatron's again."""
    from argparse import Namespace

    from megatron.core.transformer.moe import experts

    import training.megatron_patches as mp
    from training.run import Run

    patch = mp.BY_NAME["native_clamped_geglu"]
    gpt_oss = Namespace(num_experts=32, quick_geglu=True, activation_func_clamp_value=7.0)
    assert patch.when(Run(args=gpt_oss))
    for other in (Namespace(num_experts=32, quick_geglu=True, activation_func_clamp_value=None),
                  Namespace(num_experts=32, quick_geglu=False, activation_func_clamp_value=7.0),
                  Namespace(num_experts=None, quick_geglu=True, activation_func_clamp_value=7.0)):
        assert not patch.when(Run(args=other))
    mp.restore(names=("native_clamped_geglu",))   # an earlier test's run may have left it in
    original = experts.weighted_bias_quick_geglu_impl
    assert not hasattr(original, "description")    # Megatron's own
    try:
        assert mp.apply(Run(args=gpt_oss), names=("native_clamped_geglu",)) == \
            ["native_clamped_geglu"]
        assert "one Triton pass" in experts.weighted_bias_quick_geglu_impl.description
    finally:
        mp.restore(names=("native_clamped_geglu",))
    assert experts.weighted_bias_quick_geglu_impl is original


def test_no_rows_pass_through_both_expert_functions():
    """A micro-batch whose local experts get no token (possible under expert parallelism):
    empty outputs, zero bias gradients, no kernel launched with an empty grid."""
    x = torch.zeros(0, 8, requires_grad=True)
    bias = torch.randn(3, 8, requires_grad=True)
    probs = torch.zeros(0, 1, requires_grad=True)
    out = grouped_experts.add_expert_bias(x, bias, [0, 0, 0], probs)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert bias.grad.abs().max() == 0 and probs.grad.shape == (0, 1)
    y = WeightedClampedQuickGeGLU.apply(torch.zeros(0, 8, requires_grad=True),
                                        torch.zeros(0, 1), 7.0, 1.0, 1.702)
    assert y.shape == (0, 4)
    y.sum().backward()
