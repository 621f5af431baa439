"""Load an imported checkpoint into GPTModel at a parallel layout, on the CPU, two processes.

    python tests/checkpoint/layout_worker.py CKPT SAVE --tp 2 --pp 1 [--logits OUT.pt]

Each rank (torch.multiprocessing, gloo, a free localhost port) builds its part of the model
with the native spec and bf16 weights, loads CKPT through Megatron's dist_checkpointing
(training.checkpoint.megatron.load_weights), saves it again with Megatron's own
dist_checkpointing.save as a run would (SAVE/iter_0000001, that layout's chunks), and at PP=1
writes the full-vocabulary logits of a fixed batch (an fp32 copy of the model, gathered over
the TP ranks) for the parent to compare with Hugging Face's.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _worker(rank: int, world: int, port: int, a: argparse.Namespace) -> None:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state

    from tests.model.parity import gpt_model
    from training.checkpoint import megatron, record
    from training.launch.presets import PRESETS

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=a.tp,
                                             pipeline_model_parallel_size=a.pp)
    # CPU stand-ins for two CUDA calls Megatron makes regardless of device: the RoPE buffer's
    # current_device, and the synchronize before dist_checkpointing.save's write.
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    rec = record.read_record(a.ckpt)
    arch, preset = rec["architecture"], PRESETS[rec["preset"]]
    model = gpt_model(preset, arch.num_layers, "native", "torch", torch.bfloat16,
                      fused_qkv_rope=False, tp=a.tp, pp=a.pp)
    megatron.load_weights(model, a.ckpt)

    iteration = a.save / "iter_0000001"
    if rank == 0:
        iteration.mkdir(parents=True)
    dist.barrier()
    dist_checkpointing.save({"model": model.sharded_state_dict(
        metadata=dict(megatron.CONTENT_METADATA))}, str(iteration),
        content_metadata=dict(megatron.CONTENT_METADATA))
    if rank == 0:
        (a.save / megatron.TRACKER).write_text("1")

    if a.logits is not None and a.pp == 1:
        model = model.float().eval()
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, arch.vocab_size, (2, 32), generator=gen)
        positions = torch.arange(32).unsqueeze(0).expand(2, 32)
        with torch.no_grad():
            local = model(tokens, positions, None).contiguous()   # [b, s, vocab / tp]
        parts = [torch.empty_like(local) for _ in range(a.tp)]
        dist.all_gather(parts, local, group=parallel_state.get_tensor_model_parallel_group())
        if rank == 0:
            torch.save({"tokens": tokens, "logits": torch.cat(parts, dim=-1)}, a.logits)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt", type=Path)
    p.add_argument("save", type=Path)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--logits", type=Path, default=None)
    a = p.parse_args()
    world = a.tp * a.pp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port, a), nprocs=world, join=True)


if __name__ == "__main__":
    main()
