"""Token permutation of the MoE dispatchers without atomics (the native backend's permute fusion).

Megatron's token dispatchers sort the tokens by expert before the experts run (`permute`) and
sum each token's expert outputs back in its place after (`unpermute`). Without Transformer
Engine (whose fused permute is `--moe-permute-fusion`), both are torch ops that accumulate
with atomics: unpermute's forward is a zero-filled scatter_add_ of every routed copy into its
token (top-k adds per token), and permute's backward, an index_select's, is an index_add_ of
the same shape. In bf16 that is a read-modify-write per copy, contended top-k ways.

Each token's k routed copies sit at known positions of the permuted order (expert-major,
tokens ascending within an expert, as Megatron's argsort puts them), so both directions are
gathers instead:
  permute     forward  out[j] = tokens[sorted_indices[j]]                (a gather, as before)
              backward dtokens[t] = sum_k dout[position[t, k]]           (gather-sum)
  unpermute   forward  out[t] = sum_k permuted[position[t, k]]           (gather-sum)
              backward dpermuted[j] = dout[sorted_indices[j]]            (a gather)
The gather-sum is one Triton pass (each output row reads its k rows, sums in fp32, writes
once) or, on the CPU and with NATIVE_KERNELS=torch, an index_select and a sum. `position`
is [tokens, k] with -1 where a token has fewer copies (dropped by a capacity factor).

Put in place of the dispatchers' permute/unpermute by the patch table
(training.megatron_patches: native_moe_permute, native_moe_unpermute) for the cases it covers
(dropless, or dropping without padding to capacity; probabilities applied by the experts);
every other call goes to Megatron's own functions unchanged.

The all-to-all dispatcher also re-sorts its tokens by local expert around the experts
(`sort_chunks_by_idxs`: chunks of rows per (source rank, local expert), put in local-expert
order and back). Without TE's fused version, Megatron splits the tokens into those chunks and
concatenates them in the new order: with 128 local experts, 128 views and a full copy each way,
and in the backward 128 more views and zero-filled pieces per call (on the H200 at Qwen3-30B-A3B
width, 8 layers, 8 micro-batches: over half the host's operator calls of a step, session 8's
profile, dev/gpu_logs/). `sort_chunks` does it as one row gather with a precomputed
permutation, and not at all where the order is the identity: one source rank (EP x TP = 1),
whose chunks are already in local-expert order.
"""
from __future__ import annotations

import weakref

import torch

from .rope import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _gather_sum_kernel(src_ptr, index_ptr, out_ptr, H, K: tl.constexpr,
                           BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < H
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(K):
            source = tl.load(index_ptr + row * K + j)
            valid = source >= 0
            value = tl.load(src_ptr + source * H + col, mask=mask & valid, other=0.0)
            acc += value.to(tl.float32)
        tl.store(out_ptr + row * H + col, acc.to(out_ptr.dtype.element_ty), mask=mask)

_BLOCK = 1024


def gather_sum_torch(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[t] = sum over k of src[index[t, k]] (entries -1 add nothing), summed in fp32."""
    rows, k = index.shape
    picked = src.index_select(0, index.clamp(min=0).reshape(-1)).view(rows, k, src.shape[1])
    picked = picked.masked_fill((index < 0).unsqueeze(-1), 0)
    return picked.sum(dim=1, dtype=torch.float32).to(src.dtype)


def gather_sum(src: torch.Tensor, index: torch.Tensor, kernels: str = "torch") -> torch.Tensor:
    """gather_sum_torch's function; with kernels="liger" on a GPU, one Triton pass."""
    if kernels == "liger" and src.is_cuda and HAVE_TRITON:
        src, index = src.contiguous(), index.contiguous()
        rows, k = index.shape
        out = src.new_empty(rows, src.shape[1])
        if rows:
            _gather_sum_kernel[(rows, triton.cdiv(src.shape[1], _BLOCK))](
                src, index, out, src.shape[1], K=k, BLOCK=_BLOCK)
        return out
    return gather_sum_torch(src, index)


def token_positions(routing_map: torch.Tensor, slots: int) -> torch.Tensor:
    """[tokens, slots]: where each token's routed copies sit in the permuted order (-1: none).
    The permuted order is expert-major with tokens ascending, so a copy's position is the
    number of routed (expert, token) pairs before it in that order."""
    tokens, experts = routing_map.shape
    routed = routing_map.bool().t().reshape(-1)
    position = torch.cumsum(routed, dim=0) - 1
    position = torch.where(routed, position, -1).view(experts, tokens).t()
    if slots < experts:
        position = position.topk(slots, dim=1, sorted=False).values
    return position.contiguous()


_LAST_POSITIONS: tuple | None = None   # (weakref to the routing map, its version, slots, positions)


def positions_of(routing_map: torch.Tensor, slots: int) -> torch.Tensor:
    """token_positions, computed once per routing map: the dispatcher's permute and its
    unpermute (the same layer's forward, the same map object) share it. The map is held
    weakly and its in-place version checked, so a new or changed map is computed afresh."""
    global _LAST_POSITIONS
    last = _LAST_POSITIONS
    if (last is not None and last[0]() is routing_map and last[1] == routing_map._version
            and last[2] == slots):
        return last[3]
    positions = token_positions(routing_map, slots)
    _LAST_POSITIONS = (weakref.ref(routing_map), routing_map._version, slots, positions)
    return positions


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, sorted_indices, positions, kernels):
        ctx.save_for_backward(positions)
        ctx.kernels = kernels
        return tokens.index_select(0, sorted_indices)

    @staticmethod
    def backward(ctx, grad):
        (positions,) = ctx.saved_tensors
        return gather_sum(grad, positions, ctx.kernels), None, None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, permuted, sorted_indices, positions, kernels):
        ctx.save_for_backward(sorted_indices)
        return gather_sum(permuted, positions, kernels)

    @staticmethod
    def backward(ctx, grad):
        (sorted_indices,) = ctx.saved_tensors
        return grad.index_select(0, sorted_indices), None, None, None


def _slots(routing_map: torch.Tensor, topk: int | None) -> int:
    return min(topk or routing_map.shape[1], routing_map.shape[1])


def permute(tokens, routing_map, probs=None, num_out_tokens=None, fused=False,
            drop_and_pad=False, tokens_per_expert=None, align_size=0, *, original=None,
            kernels: str = "torch", topk: int | None = None):
    """Megatron's moe_utils.permute (same arguments and results), atomic-free backward.
    `topk` bounds the copies per token (the router's top-k)."""
    if fused or drop_and_pad or align_size or num_out_tokens is None:
        return original(tokens, routing_map, probs, num_out_tokens, fused, drop_and_pad,
                        tokens_per_expert, align_size)
    num_tokens = tokens.shape[0]
    routed = routing_map.bool().t().contiguous().reshape(-1)          # expert-major
    flat_sorted = routed.argsort(descending=True, stable=True)[:num_out_tokens]
    sorted_indices = flat_sorted % num_tokens
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.t().contiguous().reshape(-1)[flat_sorted]
    positions = positions_of(routing_map, _slots(routing_map, topk))
    permuted = _Permute.apply(tokens, sorted_indices, positions, kernels)
    return permuted, permuted_probs, sorted_indices, None, tokens_per_expert


def unpermute(permuted_tokens, sorted_indices, restore_shape, probs=None, routing_map=None,
              fused=False, drop_and_pad=False, pad_offsets=None, *, original=None,
              kernels: str = "torch", topk: int | None = None):
    """Megatron's moe_utils.unpermute (same arguments and result), as a gather-sum."""
    if fused or drop_and_pad or pad_offsets is not None or probs is not None \
            or routing_map is None:
        return original(permuted_tokens, sorted_indices, restore_shape, probs, routing_map,
                        fused, drop_and_pad, pad_offsets)
    positions = positions_of(routing_map, _slots(routing_map, topk))
    return _Unpermute.apply(permuted_tokens, sorted_indices, positions,
                            kernels).view(restore_shape)


def _bound(function, original, run):
    """`function` with Megatron's original (its fallback), the run's kernels and top-k."""
    from functools import wraps

    kernels, topk = run.args.native_kernels, run.args.moe_router_topk

    @wraps(function)
    def replacement(*a, **kw):
        return function(*a, original=original, kernels=kernels, topk=topk, **kw)

    replacement.description = (f"atomic-free {function.__name__} (gather-sum"
                               + (" in one Triton pass)" if kernels == "liger"
                                  else ", torch ops)"))
    return replacement


def permute_replacement(original, run):
    """The patch table's factory for token_dispatcher.permute (Megatron's is `original`)."""
    return _bound(permute, original, run)


def unpermute_replacement(original, run):
    """The patch table's factory for token_dispatcher.unpermute."""
    return _bound(unpermute, original, run)


class _RowGather(torch.autograd.Function):
    """out = x[index]; index a permutation of x's rows, `inverse` its inverse (both ways a
    gather, no atomics)."""

    @staticmethod
    def forward(ctx, x, index, inverse):
        ctx.save_for_backward(inverse)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def chunk_permutation(split_sizes: torch.Tensor, sorted_idxs: torch.Tensor) -> torch.Tensor:
    """The row index (host, int64) putting chunk sorted_idxs[0]'s rows first, then
    sorted_idxs[1]'s, ...: the chunks are consecutive runs of split_sizes rows."""
    sizes = split_sizes.to(torch.int64)
    order = sorted_idxs.to(torch.int64)
    starts = torch.cumsum(sizes, 0) - sizes
    out_sizes = sizes[order]
    out_starts = torch.cumsum(out_sizes, 0) - out_sizes
    chunk = torch.repeat_interleave(torch.arange(order.numel()), out_sizes)
    rows = torch.arange(int(out_sizes.sum()))
    return starts[order][chunk] + rows - out_starts[chunk]


def _to_device(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return index
    return index.pin_memory().to(device, non_blocking=True)


def sort_chunks(input, split_sizes, sorted_idxs, probs=None, fused=False, *, original):
    """Megatron's moe_utils.sort_chunks_by_idxs (same arguments and results): the identity
    order returns the tensors as they are, any other order is one row gather. An order on the
    GPU, sizes on the GPU with another order, or TE's fused version go to Megatron's own."""
    if fused or sorted_idxs.is_cuda:
        return original(input, split_sizes, sorted_idxs, probs=probs, fused=fused)
    # the identity needs no sizes: they may stay on the GPU (MOE_DEVICE_COUNTS)
    if torch.equal(sorted_idxs, torch.arange(sorted_idxs.numel(), dtype=sorted_idxs.dtype)):
        return input, probs
    if split_sizes.is_cuda:
        return original(input, split_sizes, sorted_idxs, probs=probs, fused=fused)
    index = chunk_permutation(split_sizes, sorted_idxs)
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(index.numel())
    index, inverse = _to_device(index, input.device), _to_device(inverse, input.device)
    output = _RowGather.apply(input, index, inverse)
    permuted_probs = None if probs is None else _RowGather.apply(probs, index, inverse)
    return output, permuted_probs


def sort_chunks_replacement(original, run):
    """The patch table's factory for token_dispatcher.sort_chunks_by_idxs."""
    from functools import wraps

    @wraps(sort_chunks)
    def replacement(*a, **kw):
        return sort_chunks(*a, original=original, **kw)

    replacement.description = ("sort by local expert as one row gather (none where the order "
                               "is the identity: EP x TP = 1)")
    return replacement


def device_counts_replacement(original, run):
    """The patch table's factory for MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize
    (MOE_DEVICE_COUNTS=1): where one rank holds every expert and the whole sequence (EP = TP =
    1, dropless), nothing the dispatcher computes is needed on the host but the tokens per
    expert, which the native grouped experts take on the GPU (grouped_experts.DeviceCounts).
    No copy to the host then, and no wait for the GPU in the middle of each MoE layer's
    forward; any other layout runs Megatron's own."""
    from functools import wraps

    from training.native.grouped_experts import DeviceCounts

    @wraps(original)
    def replacement(self, point, tokens_per_expert=None):
        if self.ep_size > 1 or self.tp_size > 1 or self.drop_and_pad:
            return original(self, point, tokens_per_expert)
        if tokens_per_expert is None or isinstance(tokens_per_expert, DeviceCounts):
            return tokens_per_expert
        return DeviceCounts(tokens_per_expert)

    replacement.description = ("tokens per expert kept on the GPU at EP = TP = 1: no host copy "
                               "or synchronisation in each MoE layer's dispatch")
    return replacement
