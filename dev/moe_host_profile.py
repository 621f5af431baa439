"""Where the host time of an MoE layer goes, on the CPU: ours (native backend) vs HF Qwen3-MoE.

The MoE bench step on the H200 is launch-bound (session 8's profile: about half the step the
GPU waits for the host), so what costs is the Python and the operator calls around the
kernels, not the kernels. Both are visible without a GPU: this builds the Qwen3-30B-A3B
structure (128 experts, top-8, q/k norms, GQA) at a tiny width, runs forward + backward
under a dispatch counter (aten operators per step) and cProfile (Python time per function,
own time), and prints each side's totals and its costliest functions, grouped by package.
The absolute times are the CPU's; the counts and the ranking are what carries to the GPU.

Usage: python dev/moe_host_profile.py [--steps 5] [--layers 2] [--top 25] [--side ours|hf|both]
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import dataclasses
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def structure(layers: int):
    """Qwen3-30B-A3B's routing structure at a width a CPU runs in milliseconds."""
    from training.moe.presets import QWEN3_30B_A3B

    return dataclasses.replace(QWEN3_30B_A3B, num_layers=layers, hidden_size=128,
                               ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
                               kv_channels=32, moe_ffn_hidden_size=32, vocab_size=1024)


def ours(preset, seq: int):
    from tests.moe.model import build_moe_gpt, cpu_dispatcher_streams

    gpt, _ = build_moe_gpt(preset, preset.num_layers, "native", "torch", "cpu", seq=seq,
                           extra=("--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"))
    from training.native.grouped_experts import GroupedLinear

    for module in gpt.modules():   # grouped_mm as on the H200 (the CPU default is the loop)
        if isinstance(module, GroupedLinear):
            module.impl = "grouped_mm"
    gpt.train()
    tokens = torch.randint(0, preset.vocab_size, (1, seq))
    positions = torch.arange(seq).unsqueeze(0)

    def step():
        with cpu_dispatcher_streams():
            loss = gpt(tokens, positions, None, labels=tokens).float().sum()
        loss.backward()
    return step


def hf(preset, seq: int):
    from tests.moe.model import hf_qwen3_moe

    model = hf_qwen3_moe(preset, preset.num_layers, "cpu")
    model.train()
    tokens = torch.randint(0, preset.vocab_size, (1, seq))

    def step():
        model(input_ids=tokens, labels=tokens).loss.backward()
    return step


def package(filename: str) -> str:
    for name in ("megatron", "transformers", "training", "torch", "liger_kernel"):
        if f"/{name}/" in filename:
            return name
    return "builtin" if filename == "~" else "other"


def measure(name: str, step, steps: int, top: int) -> dict:
    for _ in range(2):   # warm-up: first-call imports, caches, compiled regions
        step()
    counter = OpCounter()
    with counter:
        step()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    wall = (time.perf_counter() - start) / steps
    stats = pstats.Stats(profiler)
    by_package = collections.Counter()
    rows = []
    for (filename, line, func), (_cc, calls, own, _cum, _callers) in stats.stats.items():
        by_package[package(filename)] += own / steps
        rows.append((own / steps, calls // steps, f"{Path(filename).name}:{line} {func}"
                     if filename != "~" else func))
    rows.sort(reverse=True)
    print(f"\n== {name}: {wall * 1e3:.1f} ms per forward+backward (profiled), "
          f"{sum(counter.ops.values())} aten operator calls")
    print("own time by package, ms/step: " + ", ".join(
        f"{k} {v * 1e3:.1f}" for k, v in by_package.most_common()))
    print("most called operators: " + ", ".join(f"{k} {v}" for k, v in
                                                counter.ops.most_common(12)))
    print(f"{'own ms':>8} {'calls':>6}  function")
    for own, calls, where in rows[:top]:
        print(f"{own * 1e3:8.2f} {calls:6d}  {where}")
    return {"wall_ms": wall * 1e3, "aten_ops": sum(counter.ops.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--side", choices=("ours", "hf", "both"), default="both")
    args = parser.parse_args()
    torch.manual_seed(0)
    preset = structure(args.layers)
    if args.side in ("ours", "both"):
        measure("ours (native backend, torch kernels)", ours(preset, args.seq), args.steps,
                args.top)
    if args.side in ("hf", "both"):
        measure("HF Qwen3MoeForCausalLM", hf(preset, args.seq), args.steps, args.top)


if __name__ == "__main__":
    main()
