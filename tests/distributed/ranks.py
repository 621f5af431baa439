"""Parallel layouts on CPU ranks: a tiny GPTModel trained a few steps by several CPU processes
over gloo, with megatron.core's own parallel state, schedules, DDP and optimizer.

Every rank is a fork of the test process (megatron is imported once, before the fork: a spawn
would import it again in every rank). Each layout starts from the same weights: each weight's
full tensor is drawn from a generator seeded by its checkpoint key and each rank keeps its
shard by megatron's own sharded-state-dict offsets (_fill_weights). A layout can save its
model with megatron's dist_checkpointing and another load it (a resume across layouts). The
data is one fixed global batch stream; each data-parallel rank takes its rows. What a layout
returns is, per step, its loss (averaged
over micro-batches and data-parallel ranks, as Megatron reports it) and the global gradient
norm Megatron's optimizer computes over every rank before its step, and the gradient norm of
the norm weights alone (where a sequence-parallel reduction shows).

    run_layout(Layout(tp=2, sp=True))  -> [(loss, grad norm, norm-weights grad norm), ...]
"""
from __future__ import annotations

import contextlib
import os
import socket
import traceback
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

SEQ, VOCAB, STEPS = 32, 256, 3
# A clip far above any gradient norm: never clips, but Megatron then computes the global
# gradient norm over every model-parallel rank, which each step reports. Adam's step divides
# most of a wrongly reduced gradient out of the loss; the norm shows it whole.
CLIP = 1e9


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sp: bool = False
    dist_opt: bool = False
    dispatcher: str = "alltoall"
    mbs: int = 2
    gbs: int = 8
    moe: bool = False
    num_layers: int = 4
    steps: int = STEPS
    first_step: int = 0           # where in the data stream this run starts (a resume's)
    save_to: str | None = None    # megatron dist checkpoint of the model after the last step
    load_from: str | None = None  # ... and one to start from instead of the seeded weights
    extra: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(layout: Layout):
    from megatron.core.transformer import TransformerConfig

    moe = dict(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64,
               moe_token_dispatcher_type=layout.dispatcher, moe_grouped_gemm=False,
               moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
               expert_model_parallel_size=layout.ep) if layout.moe else {}
    return TransformerConfig(
        num_layers=layout.num_layers, hidden_size=64, ffn_hidden_size=128,
        num_attention_heads=4, num_query_groups=2, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, masked_softmax_fusion=False,
        bias_dropout_fusion=False, use_cpu_initialization=True, params_dtype=torch.float32,
        gradient_accumulation_fusion=False, tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp, sequence_parallel=layout.sp,
        pipeline_dtype=torch.float32, deterministic_mode=True,
        # gloo matches a batch of isend/irecv to one peer by order: with PP=2 interleaved the
        # batched exchange crosses messages (microbatches 3-4 computed on another's data);
        # Megatron's unbatched path (--overlap-p2p-communication's default off pairing) is exact
        batch_p2p_comm=False, **{**moe, **layout.extra})


def _model_chunks(layout: Layout, config):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    from training import specs
    from tests.model.parity import native_run

    # the launcher's default backend (native) with its torch kernels: what runs on the CPU
    specs.install_native(native_run("torch", fused_qkv_rope=False))
    chunks = []
    for vp in range(layout.vpp or 1):
        stage = vp if layout.vpp else None
        spec = specs.decoder_spec("native", config, vp_stage=stage, kernels="torch")
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
            max_sequence_length=SEQ, position_embedding_type="rope",
            share_embeddings_and_output_weights=False, vp_stage=stage,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)))
    return chunks


def _batches(layout: Layout):
    """This data-parallel rank's micro-batches of each step: rows of one fixed stream."""
    from megatron.core import parallel_state as ps

    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, VOCAB, (layout.first_step + layout.steps, layout.gbs, SEQ + 1),
                         generator=g)[layout.first_step:]
    dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    rows = layout.gbs // dp
    steps = []
    for step in range(layout.steps):
        mine = data[step, dp_rank * rows:(dp_rank + 1) * rows]
        steps.append([mine[i:i + layout.mbs] for i in range(0, rows, layout.mbs)])
    return steps


def _forward_step(iterator, model):
    inner = getattr(model, "module", model)
    batch = next(iterator) if (inner.pre_process or inner.post_process) else None
    tokens = batch[:, :-1].contiguous() if batch is not None else None
    labels = batch[:, 1:].contiguous() if batch is not None else None
    positions = torch.arange(SEQ).unsqueeze(0).expand(tokens.shape[0], -1) \
        if tokens is not None else None
    output = model(tokens, positions, None, labels=labels)

    def loss_func(per_token):
        loss = per_token.float().mean()
        return loss, {"loss": loss.detach().clone()}  # the schedule scales `loss` in place
    return output, loss_func


def _fill_weights(chunks) -> None:
    """The same model at every layout: each weight's full tensor is drawn from a generator
    seeded by its checkpoint key (its global name), and this rank keeps its shard, found by
    megatron's own sharded-state-dict metadata (global offset and shape: how a checkpoint
    reshards). A layout whose wiring puts a shard in the wrong place computes another model."""
    import zlib

    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    for chunk in chunks:
        for value in nested_values(chunk.sharded_state_dict()):
            tensors = nested_values(value.build()) if isinstance(value, ShardedTensorFactory) \
                else [value]
            for st in tensors:
                if not isinstance(st, ShardedTensor) or not torch.is_floating_point(st.data):
                    continue
                g = torch.Generator().manual_seed(zlib.crc32(st.key.encode()))
                full = torch.randn(st.global_shape, generator=g)
                full = 1.0 + 0.1 * full if "norm" in st.key else 0.05 * full
                lead = len(st.global_shape) - st.data.dim()    # prepended axes (layer index)
                index = tuple(slice(o, o + 1) for o in st.global_offset[:lead]) + tuple(
                    slice(o, o + n) for o, n in zip(st.global_offset[lead:], st.data.shape))
                with torch.no_grad():
                    st.data.copy_(full[index].reshape(st.data.shape))


def _train(rank: int, world: int, port: int, layout: Layout, queue):
    try:
        torch.set_num_threads(1)   # tiny matmuls: threads only contend (2-core CI machines)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
        # megatron-core's CUDA-only spellings (device='cuda' buffers, .cuda(), synchronize)
        # answered on the CPU: tests/native/megatron_cpu.py, as its one-rank tests do
        from tests.native.megatron_cpu import _CudaNamesOnCpu

        torch.cuda.current_device = lambda: "cpu"
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_stream = lambda *a, **k: _CPU_STREAM
        torch.cuda.stream = lambda stream: contextlib.nullcontext()
        # the alltoall dispatcher makes a device-to-host side stream when it is first built
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _CPU_STREAM
        # ... and turns the split sizes into numpy only when they come from a GPU: on the CPU
        # they stay tensors, which all_to_all_single's split-size lists refuse
        from megatron.core.transformer.moe import token_dispatcher
        token_dispatcher.maybe_move_tensor_to_cpu = _splits_as_numpy
        # dropout is 0: the model-parallel CUDA RNG Megatron forks around it is not needed
        from megatron.core.tensor_parallel import random as mp_random
        mp_random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
        with _CudaNamesOnCpu():
            losses = _steps(layout)
        if rank == 0:
            queue.put(("ok", losses))
    except BaseException:  # noqa: BLE001 - the parent reports where the rank stopped
        queue.put(("error", f"rank {rank}: {traceback.format_exc()}"))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _steps(layout: Layout) -> list[tuple]:
    """Build the layout's model, train it layout.steps steps; (loss, gradient norm, the norm
    weights' gradient norm: None with the distributed optimizer, whose grads are shards)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig,
                                           finalize_model_grads)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep)
    config = _config(layout)
    chunks = _model_chunks(layout, config)
    _fill_weights(chunks)
    if layout.load_from:
        from megatron.core import dist_checkpointing

        state = dist_checkpointing.load(_sharded(chunks), layout.load_from)
        for i, chunk in enumerate(chunks):
            chunk.load_state_dict(state[f"chunk{i}"])
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                        use_distributed_optimizer=layout.dist_opt)
    chunks = [DistributedDataParallel(config, ddp, chunk) for chunk in chunks]
    config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.0, clip_grad=CLIP,
                        use_distributed_optimizer=layout.dist_opt), chunks)
    forward_backward = get_forward_backward_func()
    losses = []
    for micro in _batches(layout):
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        iterators = [iter(micro) for _ in chunks]
        out = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=len(micro),
            seq_length=SEQ, micro_batch_size=layout.mbs, forward_only=False)
        norms = _norm_grads(chunks, layout) if not layout.dist_opt else None
        _, grad_norm, _ = optimizer.step()
        mean = torch.tensor([0.0, 0.0])
        if ps.is_pipeline_last_stage(ignore_virtual=True):
            mean = torch.tensor([float(sum(o["loss"] for o in out)) / len(out), 1.0])
        torch.distributed.all_reduce(mean)    # every last-stage rank of every DP rank
        losses.append((float(mean[0] / mean[1]), float(grad_norm), norms))
    if layout.save_to:
        _save([c.module for c in chunks], layout.save_to)
    return losses


def _sharded(chunks) -> dict:
    """One sharded state dict of every model chunk (their keys are global layer numbers, so a
    checkpoint saved at one layout loads at any other)."""
    return {f"chunk{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}


def _save(chunks, path: str) -> None:
    """megatron's dist_checkpointing.save, on CPU ranks: its writer collects results through
    a queue of a spawned Manager (a second interpreter importing megatron); a thread queue
    serves the same writer threads here."""
    import queue
    from pathlib import Path

    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    filesystem_async._results_queue = queue.Queue()
    if torch.distributed.get_rank() == 0:
        Path(path).mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    dist_checkpointing.save(_sharded(chunks), path)


def _norm_grads(chunks, layout: Layout) -> float:
    """The norm weights' reduced gradient (L2 over every layer's norms): they are replicated
    over TP and, under sequence parallelism, each rank holds only its sequence shard's share
    until Megatron all-reduces them; in the global norm they are lost among the matrices."""
    from megatron.core import parallel_state as ps

    total = torch.zeros(1, dtype=torch.float64)
    if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
        for chunk in chunks:
            for name, param in chunk.named_parameters():
                if "norm" in name and getattr(param, "main_grad", None) is not None:
                    total += param.main_grad.double().pow(2).sum()
    torch.distributed.all_reduce(total)
    return float(total.sqrt())


class _CpuStream:
    """torch.cuda.current_stream() on the CPU: one stream, nothing to wait for."""

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass

    def record_event(self, event=None):
        return self


_CPU_STREAM = _CpuStream()


def _splits_as_numpy(tensor, as_numpy: bool = False, record_stream: bool = False):
    """megatron's maybe_move_tensor_to_cpu for a CPU tensor: numpy when asked, as on a GPU."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


class RankError(RuntimeError):
    """A rank raised: the message carries its traceback (where megatron stopped)."""


def preload() -> None:
    """Import what the ranks run before forking them: each fork then starts with megatron
    loaded (a fork copies the parent; importing megatron in every rank costs ~10 s each)."""
    import megatron.core.dist_checkpointing  # noqa: F401
    import megatron.core.dist_checkpointing.strategies.filesystem_async  # noqa: F401
    import megatron.core.dist_checkpointing.strategies.torch  # noqa: F401
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401
    import megatron.core.transformer.moe.token_dispatcher  # noqa: F401

    import tests.model.parity  # noqa: F401
    import tests.native.megatron_cpu  # noqa: F401
    import training.native.attention  # noqa: F401
    import training.specs  # noqa: F401


def run_layout(layout: Layout, timeout: float = 120.0) -> list[tuple]:
    """The layout's (loss, global gradient norm, norm weights' gradient norm) per step, from
    forked ranks; RankError with the first failing rank's traceback."""
    import torch.multiprocessing as mp

    preload()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_train, args=(r, layout.world, port, layout, queue))
             for r in range(layout.world)]
    for p in procs:
        p.start()
    try:
        kind, value = queue.get(timeout=timeout)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if kind == "error":
        raise RankError(value)
    return value
