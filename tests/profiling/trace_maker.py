"""Profile a tiny real model trained by N processes; write one chrome trace per rank.

    python tests/profiling/trace_maker.py OUT_DIR [--device cpu|cuda] [--world N] [--steps S]

The processes (torch.multiprocessing; gloo on CPU, NCCL on CUDA; rendezvous over a localhost
TCP store on a free port) train a one-block transformer (embedding, LayerNorm, SDPA attention,
MLP, LM head) with DistributedDataParallel under torch.profiler, on the schedule shape of
Megatron's --use-pytorch-profiler (one warmup step, then S active steps), with the training
ranges of training/profiling/ranges.py around each phase. DDP's gradient all-reduce runs
through a comm hook that records its launch as RANGE_GRAD_REDUCE.

CPU: rank-<N>.json (CPU activity). CUDA: rank-<N>.json.gz (CPU + CUDA activity, bf16 autocast),
named as Megatron names its traces.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from training.profiling import ranges as rg

# (vocab, dim, heads, seq, batch) per device: tiny on CPU, big enough on a GPU for real GEMMs.
SHAPES = {"cpu": (128, 64, 4, 32, 8), "cuda": (1024, 512, 8, 512, 8)}


class TinyBlockLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def _allreduce_hook(state, bucket):
    with rg.train_range(rg.RANGE_GRAD_REDUCE):
        buf = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _worker(rank: int, world: int, port: int, out: str, steps: int, device: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    vocab, dim, heads, seq, batch = SHAPES[device]
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        trace = f"{out}/rank-{rank}.json.gz"
    else:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        activities = [torch.profiler.ProfilerActivity.CPU]
        trace = f"{out}/rank-{rank}.json"
    torch.manual_seed(0)
    model = DDP(TinyBlockLM(vocab, dim, heads).to(dev), device_ids=[rank] if device == "cuda" else None)
    model.register_comm_hook(None, _allreduce_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=dev).manual_seed(rank)
    rg.enable_ranges(True)

    def export(prof) -> None:
        prof.export_chrome_trace(trace)

    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=export) as prof:
        for _ in range(steps + 1):
            with rg.train_range(rg.RANGE_DATA):
                tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen, device=dev)
            with rg.train_range(rg.RANGE_FORWARD):
                with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
                    logits = model(tokens[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
            with rg.train_range(rg.RANGE_BACKWARD):
                loss.backward()
            with rg.train_range(rg.RANGE_OPTIMIZER):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            prof.step()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(out: Path, device: str = "cpu", world: int = 2, steps: int = 3) -> None:
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world, free_port(), str(out), steps, device), nprocs=world, join=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    main(a.out, a.device, a.world, a.steps)
