"""The ROCm fork's closing summary lines, in its words, from this run's steady-state summary.

ROCm/Megatron-LM's examples/llama/train_llama{2,3}.sh end by grepping their log and printing

    throughput per GPU: <mean TFLOP/s/GPU>
    elapsed time per iteration: <mean ms>
    tokens/GPU/s: <BS * SEQ_LENGTH * 1000 / (ms * world size)>
    mem usages: <mean share of the device's memory in use>

and its users' scripts grep those lines. The run prints them after its own [summary] line
(training/pretrain_gpt.py), from training.metrics' steady-state summary: model TFLOP/s per
GPU, mean step time, tokens/s per GPU, and the peak memory the caching allocator reserved
(max over ranks) as a share of the GPU's memory. docs/coming_from_rocm_megatron.md says how
each differs from the fork's average. Standard library only.
"""
from __future__ import annotations

GIB = 2 ** 30


def fork_summary_lines(summary: dict, device_memory_bytes: int | None) -> list[str]:
    """The fork's four lines for a measured summary (none when throughput was not measured;
    no memory line without the device's size)."""
    if not summary.get("measured"):
        return []
    lines = [f"throughput per GPU: {summary['model_tflops_per_gpu']:.6f}",
             f"elapsed time per iteration: {summary['step_time_s_mean'] * 1000:.6f}",
             f"tokens/GPU/s: {summary['tokens_per_s_per_gpu']:.6f}"]
    reserved = summary.get("peak_reserved_gib_max_over_ranks")
    if reserved is not None and device_memory_bytes:
        lines.append(f"mem usages: {reserved * GIB / device_memory_bytes:.4f}")
    return lines
