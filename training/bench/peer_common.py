"""What the peer runners (Hugging Face, torchtitan) share: their command line and their result,
computed the way ours is (harmonic mean after the warm-up, Megatron's FLOPs convention)."""
from __future__ import annotations

import argparse
import json


def preset_named(name: str):
    """A model preset by name: the dense ones (training/launch/presets.py) or the MoE family's
    (training/moe/presets.py)."""
    from training.launch.presets import PRESETS
    from training.moe.gpt_oss import PRESETS as GPT_OSS_PRESETS
    from training.moe.presets import MOE_PRESETS

    return {**PRESETS, **MOE_PRESETS, **GPT_OSS_PRESETS}[name]


def add_peer_arguments(parser: argparse.ArgumentParser, steps: int, warmup: int) -> None:
    parser.add_argument("--model", default="llama3-8B")
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=8192)
    parser.add_argument("--mbs", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--json-out", required=True)
    parser.add_argument("--profile-dir", default=None,
                        help="capture the last two steps with the torch profiler into this folder "
                             "(a trace training.profiling.trace_report reads, as ours with "
                             "PROFILE=torch)")


def check_profile_steps(parser: argparse.ArgumentParser, args) -> None:
    """--profile-dir records the last two steps after one unrecorded: refused (exit 2, one
    line) before any model is built when the run has fewer than 3."""
    if args.profile_dir is not None and args.warmup + args.steps < 3:
        parser.error(f"--profile-dir needs at least 3 steps (one before the two recorded); "
                     f"--warmup {args.warmup} + --steps {args.steps} give "
                     f"{args.warmup + args.steps}")


def start_profiler(folder: str | None, steps: int):
    """A started torch profiler recording the last two of `steps` (None without a folder);
    its trace goes to FOLDER/rank-0.json.gz."""
    if folder is None:
        return None
    from pathlib import Path

    import torch

    if steps < 3:
        raise ValueError("a profile needs at least 3 steps (check_profile_steps says so first)")
    Path(folder).mkdir(parents=True, exist_ok=True)

    def save(prof):
        prof.export_chrome_trace(str(Path(folder) / "rank-0.json.gz"))

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    profiler = torch.profiler.profile(
        activities=activities, on_trace_ready=save,
        schedule=torch.profiler.schedule(wait=steps - 3, warmup=1, active=2, repeat=1))
    profiler.start()
    return profiler


def write_result(args, times: list[float], losses: list[float] | None, optimizer_state: str,
                 **extra) -> dict:
    """Steady-state throughput of one peer run, written to args.json_out."""
    import torch

    from training.metrics import flops_per_token, peak_tflops
    from training.run_description import Model

    shape = Model.of(preset_named(args.model), args.num_layers, args.seq_length)
    steady = times[args.warmup:]
    per_gpu = args.global_batch * args.seq_length * len(steady) / sum(steady)
    tflops = flops_per_token(shape) * per_gpu / 1e12
    peak = peak_tflops(torch.cuda.get_device_name())
    samples = {"iteration": list(range(1, len(times) + 1)), "step_time_s": times,
               "warmup": [i < args.warmup for i in range(len(times))]}
    if losses is not None:
        samples["loss"] = losses
    result = {
        "samples": samples,
        "tokens_per_s_per_gpu": per_gpu, "model_tflops_per_gpu": tflops,
        "summary": {"tokens_per_s_per_gpu": per_gpu, "model_tflops_per_gpu": tflops,
                    "mfu": tflops / peak if peak else None, "steps": len(steady),
                    "warmup_iters": args.warmup},
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "optimizer_state": optimizer_state,
        **extra,
    }
    from training.safe_files import open_write

    with open_write(args.json_out, "benchmark JSON") as f:
        json.dump(result, f)
    return result
