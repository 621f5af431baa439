"""Grouped expert linears for the native backend: torch's grouped GEMM, no Transformer Engine.

megatron-core 0.19.2 runs the experts of an MoE layer either as TEGroupedMLP (one grouped GEMM
per projection, through TE's GroupedLinear) or, without TE, as SequentialMLP: a Python loop
over the local experts, two GEMMs each, forward and backward. TEGroupedMLP itself is not tied
to TE: it takes its fc1/fc2 linears from builders (experts.GroupedLinearFc1Builder and
GroupedLinearFc2Builder) and calls them as `linear(tokens, tokens_per_expert) -> (out, bias)`.
`ColumnGroupedLinear` and `RowGroupedLinear` fill those slots with torch's grouped matrix
multiply (`torch.nn.functional.grouped_mm`: one CUTLASS kernel over all experts, bf16 on
Hopper and Blackwell, jagged token counts, differentiable), so the native backend gets
TEGroupedMLP's grouped experts, routing-weighted SwiGLU and checkpoint layout.

Each projection keeps the weights of its local experts in ONE parameter [experts, out, in]
(grouped_mm reads them in place; per-expert parameters would be stacked, a copy of every
expert's weights, at each forward). Its checkpoint tensor is the same global tensor
SequentialMLP and TEGroupedMLP save (experts along the first axis, gate and up halves of fc1
sharded like theirs), so checkpoints move between the three.

Where grouped_mm has no fast kernel (the CPU, other dtypes, GPUs before Hopper) the same
module runs a loop over the experts (`grouped_matmul(..., impl="loop")`), numerically the
reference the tests compare against.

Biased experts (gpt-oss: `--add-bias-linear`) keep each projection's biases in one parameter
[experts, out] beside the weight. fc1's bias is added to each row by its expert (one gather);
fc2's is returned, as TE's grouped linear returns it (TEGroupedMLP builds fc2 with
skip_bias_add), for the experts module to add weighted by each row's routing probability:
`BiasedGroupedMLP` does that in one gather too, where Megatron's TEGroupedMLP splits the rows
by host counts (which MOE_DEVICE_COUNTS keeps on the GPU). Both go through ExpertBias
(training/native/expert_bias.py: one Triton pass forward, a GEMM and one pass backward, where
autograd's gather backward is index_put).

With MOE_WGRAD_FUSION (WGRAD_FUSION; the MoE launch's default where it was measured, SM90),
GRADIENT_ACCUMULATION_FUSION and Megatron's DDP (the weight has a `main_grad`), the grouped_mm
path adds its weight gradients into main_grad in the backward (GroupedMatmulAccumulate, the
kernel in grouped_wgrad.py), as Megatron's dense linears do.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from functools import lru_cache, partial
from itertools import accumulate

import torch

from training.native import grouped_wgrad
from training.native.expert_bias import ExpertBias

# auto: grouped_mm where it has its fast kernel, the loop elsewhere
IMPLS = ("auto", "grouped_mm", "loop")

# The experts' weight gradients into main_grad by the Triton kernel (MOE_WGRAD_FUSION,
# --moe-wgrad-fusion; set for the run by training.specs.moe_parts). The MoE launch gives the
# flag by default where it was measured (SM90: bench part moe-levers-wgrad, and
# tests/gpu/test_grouped_wgrad_gpu.py on an H200; training/moe/layer.py's wgrad_fusion); off
# here until a run sets it (a plain torchrun without the flag, the modules used alone).
WGRAD_FUSION = {"on": False}


def grouped_mm_available() -> bool:
    """torch >= 2.8 exposes the grouped GEMM (torch._grouped_mm; F.grouped_mm from 2.10)."""
    return hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm")


def has_fast_grouped_mm(device: torch.device, dtype: torch.dtype) -> bool:
    """grouped_mm's CUTLASS path: CUDA, bf16 in and out, SM90 or SM100 (torch 2.11 falls back
    to a loop with a host copy of the offsets elsewhere)."""
    if device.type != "cuda" or dtype != torch.bfloat16 or not grouped_mm_available():
        return False
    return torch.cuda.get_device_capability(device)[0] in (9, 10)


def describe(impl: str = "auto") -> str:
    if impl == "loop":
        return "native grouped experts: one GEMM per expert (loop)"
    return ("native grouped experts: torch grouped_mm (one CUTLASS grouped GEMM per projection, "
            "bf16 on SM90/SM100" + ("; a loop over the experts elsewhere)" if impl == "auto"
                                    else ")"))


def _grouped_mm(x: torch.Tensor, weight_t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    if fn is not None:
        return fn(x, weight_t, offs=offsets)
    return torch._grouped_mm(x, weight_t, offs=offsets)


def group_offsets(counts: list[int], device: torch.device) -> torch.Tensor:
    """End offset of each expert's rows (int32, on the device). Copied from pinned memory
    without blocking: a pageable host-to-device copy would wait for the stream."""
    ends = torch.tensor(list(accumulate(counts)), dtype=torch.int32,
                        pin_memory=device.type == "cuda")
    return ends.to(device, non_blocking=True)


class DeviceCounts:
    """Tokens per local expert left on the GPU (MOE_DEVICE_COUNTS), where Megatron's grouped
    experts expect a host list: TEGroupedMLP.forward calls `.tolist()` and hands the result to
    the fc1 and fc2 linears, so `.tolist()` returns the object itself, and the linears take
    grouped_mm's offsets from it (one cumulative sum on the GPU, shared by both). Anything
    that would read the counts on the host (iterating) raises: that read is the per-layer
    synchronisation this exists to avoid."""

    def __init__(self, counts: torch.Tensor):
        self.counts = counts
        self._ends: torch.Tensor | None = None

    def tolist(self) -> "DeviceCounts":
        return self

    def __len__(self) -> int:
        return self.counts.numel()

    def __iter__(self):
        raise TypeError("the tokens per expert are on the GPU (MOE_DEVICE_COUNTS=1): reading "
                        "them on the host would synchronise with the GPU")

    def ends(self) -> torch.Tensor:
        """grouped_mm's offsets: each expert's end row (int32, on the counts' device)."""
        if self._ends is None:
            self._ends = torch.cumsum(self.counts, 0, dtype=torch.int32)
        return self._ends


def expert_of_rows(counts: "list[int] | DeviceCounts", rows: int,
                   device: torch.device) -> torch.Tensor:
    """The local expert of each row of the grouped input (rows sorted by expert), on the
    device: counts on the GPU stay there (repeat_interleave with its output size given reads
    nothing back)."""
    tokens = counts.counts if isinstance(counts, DeviceCounts) else torch.tensor(
        list(counts), dtype=torch.long).to(device, non_blocking=True)
    experts = torch.arange(tokens.numel(), device=tokens.device)
    return torch.repeat_interleave(experts, tokens, output_size=rows)


def add_expert_bias(x: torch.Tensor, bias: torch.Tensor, counts: "list[int] | DeviceCounts",
                    probs: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, out] (rows sorted by expert) plus each row's expert bias, weighted by probs."""
    return ExpertBias.apply(x, bias, expert_of_rows(counts, x.shape[0], x.device), probs)


class GroupedMatmulAccumulate(torch.autograd.Function):
    """grouped_mm's x @ weight[e].T whose backward adds the weight gradient into `main_grad`
    (training/native/grouped_wgrad.py) instead of returning it: gradient-accumulation fusion
    with Megatron's contract. The weight's `grad_added_to_main_grad` (DDP's attribute) is set
    and a placeholder gradient returned, so DDP's backward hook runs (under
    overlap_grad_reduce it asserts a gradient) and adds nothing; without DDP's attribute, no
    weight gradient. dX is grouped_mm's, as in the autograd path."""

    @staticmethod
    def forward(ctx, x, weight, ends, main_grad):
        ctx.save_for_backward(x, weight, ends)
        ctx.main_grad = main_grad   # kept out of save_for_backward: written in the backward
        return _grouped_mm(x, weight.transpose(1, 2), ends)

    @staticmethod
    def backward(ctx, dy):
        x, weight, ends = ctx.saved_tensors
        dy = dy.contiguous()
        dx = _grouped_mm(dy, weight, ends) if ctx.needs_input_grad[0] else None
        grouped_wgrad.accumulate_(ctx.main_grad, x, dy, ends)
        dw = None
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True   # DDP's hook adds only zero_out_wgrad's zeros
            dw = (torch.zeros_like if getattr(weight, "zero_out_wgrad", False)
                  else torch.empty_like)(weight)
        return dx, dw, None, None


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: "list[int] | DeviceCounts",
                   impl: str = "auto", main_grad: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of x grouped by expert (counts[e] rows for expert e, in order) times each expert's
    weight transposed: out[rows of e] = x[rows of e] @ weight[e].T. weight: [experts, out, in].
    Counts on the device (DeviceCounts) go to grouped_mm as they are; its loop (the CPU, GPUs
    without the fast kernel) reads them on the host. `main_grad`: where grouped_mm runs, its
    backward accumulates the weight gradient there (GroupedMatmulAccumulate)."""
    if len(counts) != weight.shape[0]:
        raise ValueError(f"{len(counts)} token counts for {weight.shape[0]} experts")
    use_grouped = impl == "grouped_mm" or (impl == "auto"
                                           and has_fast_grouped_mm(x.device, x.dtype))

    def grouped(ends):
        if main_grad is None:
            return _grouped_mm(x, weight.transpose(1, 2), ends)
        return GroupedMatmulAccumulate.apply(x, weight, ends, main_grad)

    if isinstance(counts, DeviceCounts):
        if use_grouped:
            return (grouped(counts.ends()) if x.shape[0] > 0
                    else x.new_empty(0, weight.shape[1]))
        counts = counts.counts.tolist()
    if sum(counts) != x.shape[0]:
        raise ValueError(f"token counts add up to {sum(counts)}, the input has {x.shape[0]} rows")
    if use_grouped and x.shape[0] > 0:
        return grouped(group_offsets(counts, x.device))
    # The loop: unbind once (its backward stacks the experts' gradients in one tensor; indexing
    # weight[e] per expert would build a full-size zero gradient for each).
    pieces = [part @ w.t() for part, w in zip(torch.split(x, counts), weight.unbind(0))]
    return torch.cat(pieces) if pieces else x.new_empty(0, weight.shape[1])


class GroupedLinear(torch.nn.Module):
    """One projection of every local expert, in the slot of Megatron's grouped linear builders
    (GroupedLinearFc1Builder / Fc2Builder: `linear(x, tokens_per_expert) -> (out, bias)`).

    The token dispatcher does the expert-parallel and expert-tensor-parallel communication, as
    it does for TE's grouped linear: this module computes its local shard only, fc1 (column)
    with output_size / ETP rows per expert, fc2 (row) with input_size / ETP columns.
    `impl` (IMPLS) is kept on the instance; tests set it to compare the two paths."""

    parallel_mode = "column"

    def __init__(self, num_local_experts: int, input_size: int, output_size: int, *, config,
                 init_method, bias: bool, skip_bias_add: bool, is_expert: bool = True,
                 tp_comm_buffer_name: str | None = None, pg_collection=None,
                 name: str | None = None, impl: str = "auto"):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"unknown grouped-experts implementation {impl!r}: use {IMPLS}")
        self.impl = impl
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.utils import get_pg_rank, get_pg_size

        if not is_expert:
            raise ValueError("GroupedLinear holds experts only")
        self.config = config
        self.num_local_experts = num_local_experts
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self._ep_group, self._tp_group = pg_collection.ep, pg_collection.expt_tp
        self._dp_group = pg_collection.expt_dp
        tp_size = get_pg_size(self._tp_group)
        self.tp_rank, self.tp_size = get_pg_rank(self._tp_group), tp_size
        if self.parallel_mode == "column":
            output_size //= tp_size
        else:
            input_size //= tp_size
        self.in_features, self.out_features = input_size, output_size
        self.weight = torch.nn.Parameter(torch.empty(
            num_local_experts, output_size, input_size, dtype=config.params_dtype,
            device="cpu" if config.use_cpu_initialization else torch.cuda.current_device()))
        if config.perform_initialization:
            self._initialize(init_method)
        # fc1 adds its bias; fc2 returns it (skip_bias_add) for the routing-weighted add
        self.skip_bias_add = skip_bias_add
        self.bias = None
        if bias:   # zeros, as Megatron's and TE's linears start their biases
            self.bias = torch.nn.Parameter(torch.zeros(
                num_local_experts, output_size, dtype=config.params_dtype,
                device=self.weight.device))
        etp = config.expert_tensor_parallel_size or config.tensor_model_parallel_size
        expert_groups = (config.expert_model_parallel_size > 1
                         or etp != config.tensor_model_parallel_size)
        # Megatron's DDP reduces parameters with allreduce=False over the expert-data-parallel
        # group; tensor_model_parallel marks a shard (every ETP rank's part counts in the
        # gradient norm). The same attributes TE's grouped linear gets.
        self.weight.allreduce = not expert_groups
        self.weight.tensor_model_parallel = True
        self.weight.partition_dim = 1 if self.parallel_mode == "column" else 2
        self.weight.partition_stride = 1
        if self.bias is not None:
            self.bias.allreduce = self.weight.allreduce
            # fc1's bias is split by ETP with its rows; fc2's is whole on every ETP rank
            self.bias.tensor_model_parallel = self.parallel_mode == "column"
            self.bias.partition_dim = 1
            self.bias.partition_stride = 1

    @torch.no_grad()
    def _initialize(self, init_method) -> None:
        from megatron.core.tensor_parallel.random import (
            get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name)

        tracker = get_cuda_rng_tracker()
        fork = (tracker.fork(get_expert_parallel_rng_tracker_name())
                if self.weight.is_cuda and tracker.is_initialized() else nullcontext())
        with fork:  # each EP rank draws different experts, as Megatron's expert linears do
            for expert in self.weight:
                init_method(expert)

    def forward(self, x: torch.Tensor, tokens_per_expert: "list[int] | DeviceCounts"):
        counts = tokens_per_expert if isinstance(tokens_per_expert, DeviceCounts) \
            else list(tokens_per_expert)
        out = grouped_matmul(x, self.weight, counts, self.impl, self._fused_main_grad())
        if self.bias is None:
            return out, None
        if self.skip_bias_add:
            return out, self.bias
        return add_expert_bias(out, self.bias, counts), None

    def _fused_main_grad(self) -> torch.Tensor | None:
        """Megatron DDP's gradient buffer for the weight where the backward is to accumulate
        into it (gradient_accumulation_fusion: GRADIENT_ACCUMULATION_FUSION), else None."""
        if not (WGRAD_FUSION["on"] and getattr(self.config, "gradient_accumulation_fusion", False)
                and self.weight.requires_grad and torch.is_grad_enabled()):
            return None
        return getattr(self.weight, "main_grad", None)

    def backward_dw(self) -> None:
        """Delayed weight gradients (TE's delay_wgrad_compute) are not implemented: the
        weight gradient is computed in the backward pass."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: dict | None = None):
        """The global tensor SequentialMLP and TEGroupedMLP save for this projection
        ([all experts, out, in]): experts along axis 0 (this EP rank's block), the ETP shard
        along out (fc1) or in (fc2); fc1's gate and up halves sharded apart as Megatron's
        SwiGLU factory does. A bias is its own key ([all experts, out]) beside the weight."""
        sharded = self._sharded(f"{prefix}weight", self.weight, sharded_offsets)
        if self.bias is not None:
            sharded.update(self._sharded(f"{prefix}bias", self.bias, sharded_offsets))
        return sharded

    def _sharded(self, key: str, tensor: torch.Tensor, sharded_offsets: tuple):
        """One projection tensor (weight [experts, out, in] or bias [experts, out]) as its
        global checkpoint tensor."""
        from megatron.core.dist_checkpointing.mapping import (ShardedTensor,
                                                              ShardedTensorFactory)
        from megatron.core.utils import get_pg_rank, get_pg_size

        prepend = len(sharded_offsets)
        ep_rank, ep_size = get_pg_rank(self._ep_group), get_pg_size(self._ep_group)
        replica_id = (0, 0, get_pg_rank(self._dp_group))
        expert_axis = (prepend, ep_rank, ep_size)
        if self.parallel_mode == "row" and tensor.dim() == 2:   # fc2's bias: whole on each
            return {key: ShardedTensor.from_rank_offsets(         # ETP rank, one replica saved
                key, tensor, *sharded_offsets, expert_axis,
                replica_id=(0, self.tp_rank, get_pg_rank(self._dp_group)),
                prepend_axis_num=prepend)}
        if self.parallel_mode == "row":
            return {key: ShardedTensor.from_rank_offsets(
                key, tensor, *sharded_offsets, expert_axis,
                (prepend + 2, self.tp_rank, self.tp_size),
                replica_id=replica_id, prepend_axis_num=prepend)}
        if not self.config.gated_linear_unit:
            return {key: ShardedTensor.from_rank_offsets(
                key, tensor, *sharded_offsets, expert_axis,
                (prepend + 1, self.tp_rank, self.tp_size),
                replica_id=replica_id, prepend_axis_num=prepend)}
        tp_rank, tp_size = self.tp_rank, self.tp_size

        @torch.no_grad()
        def build(key, tensor, replica_id, flattened_range):
            gate, up = torch.chunk(tensor, 2, dim=1)
            return [ShardedTensor.from_rank_offsets(
                key, half, *sharded_offsets, expert_axis, (prepend + 1, rank, 2 * tp_size),
                replica_id=replica_id, prepend_axis_num=prepend)
                for half, rank in ((gate, tp_rank), (up, tp_size + tp_rank))]

        @torch.no_grad()
        def merge(halves):
            return torch.cat(halves, dim=1)

        return {key: ShardedTensorFactory(key, tensor, build, merge, replica_id)}

    def extra_repr(self) -> str:
        return (f"experts={self.num_local_experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, ETP={self.tp_size}")


class ColumnGroupedLinear(GroupedLinear):
    """fc1: hidden -> (gate, up) per expert, output sharded over expert-tensor parallelism."""

    parallel_mode = "column"


class RowGroupedLinear(GroupedLinear):
    """fc2: FFN -> hidden per expert, input sharded over expert-tensor parallelism."""

    parallel_mode = "row"


def bf16_config(config):
    """The experts' view of a TransformerConfig: without the fp8/fp4 recipe. Under TE's recipes
    the grouped_mm experts compute in the model's dtype (TE's autocast does not reach torch
    ops), so TEGroupedMLP must not pad each expert's tokens for quantised GEMMs (its padding
    reads the counts on the host). A shallow copy: every other field is shared."""
    if not (config.fp8 or config.fp4):
        return config
    config = copy.copy(config)
    config.fp8 = config.fp4 = None
    return config


@lru_cache(maxsize=None)
def biased_grouped_mlp():
    """TEGroupedMLP whose fc2 bias is added as one gather per layer: each row gets its
    expert's bias times its routing probability (Megatron's `_apply_bias` splits the rows by
    host counts, one add per expert; with the counts on the GPU, MOE_DEVICE_COUNTS, it could
    not run at all)."""
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    class BiasedGroupedMLP(TEGroupedMLP):
        @staticmethod
        def _apply_bias(intermediate_parallel, bias_parallel, tokens_per_expert,
                        permuted_probs):
            if bias_parallel is None:
                return intermediate_parallel
            shape = intermediate_parallel.shape
            flat = intermediate_parallel.reshape(-1, shape[-1])
            return add_expert_bias(flat, bias_parallel, tokens_per_expert,
                                   permuted_probs).view(shape)

    return BiasedGroupedMLP


def _native_grouped_mlp(num_local_experts, config, submodules, *, bias: bool = False,
                        **kwargs):
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    cls = biased_grouped_mlp() if bias else TEGroupedMLP
    return cls(num_local_experts, bf16_config(config), submodules, **kwargs)


def grouped_experts_builder(impl: str = "auto", bias: bool = False):
    """The `experts` entry of Megatron's MoE submodules: TEGroupedMLP on these linears (with
    the recipe-free config: bf16_config; `bias`: the config has biased linears, gpt-oss, and
    BiasedGroupedMLP adds fc2's)."""
    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules

    return partial(_native_grouped_mlp, bias=bias, submodules=GroupedMLPSubmodules(
        linear_fc1=partial(ColumnGroupedLinear, impl=impl),
        linear_fc2=partial(RowGroupedLinear, impl=impl)))


def set_impl(model, impl: str) -> int:
    """Every GroupedLinear of a built model to `impl`; returns how many (tests compare the
    implementations on one model)."""
    linears = [m for m in model.modules() if isinstance(m, GroupedLinear)]
    for linear in linears:
        linear.impl = impl
    return len(linears)
