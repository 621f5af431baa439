"""Throughput, FLOPs, MFU and memory: the numbers a run reports, and how they are computed.

FLOPs convention (Megatron's, so our figures and Megatron's --log-throughput agree):
per token, a dense Llama layer costs, in the forward pass,
    2*h*(h + 2*h*g/n)   QKV projection (GQA: g KV groups of n heads)
    2*h*h               attention output projection
    2*s*h               core attention (QK^T and AV are 4*s*h; the causal mask halves them)
    6*h*f               SwiGLU MLP (three h x f matrices)
plus 2*h*V for the logits; training is 3x the forward (backward = 2x). For Llama3-8B at
seq 8192 this is 51.5 GFLOP/token; "model TFLOP/s" counts these FLOPs only (no recompute).
Where the head dim d is not h/n (Qwen3), the attention terms use the projection width n*d:
2*h*(n*d + 2*g*d), 2*n*d*h and 2*s*n*d.

Mixture-of-experts layers count the parameters a token is active in: in place of the MLP,
    2*h*E               the router (E experts)
    6*h*f_e*k           the k experts each token is routed to (FFN width f_e each)
    6*h*f_s             the shared expert, if any (FFN width f_s)
per MoE layer. Megatron's --log-throughput counts the same minus the router (2*h*E per
layer, 0.7% of Qwen3-30B-A3B's FLOPs), so our MoE figures are that much higher than its
throughput line. Tokens dropped by a capacity factor are counted as routed (the convention
counts the model, not the run). tokens/s/GPU divides by every GPU of the run, expert-parallel
ones included.

Headline: tokens/s/GPU = global_batch * seq_length / step_time / world_size. Steady state is
the harmonic mean over the iterations after a warm-up window, i.e. total tokens over total
time of those iterations (Primus' convention). MFU divides model TFLOP/s/GPU by the dense
peak of the GPU (training.platforms); an unknown GPU reports 'peak unknown'.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from training.cli import ArgumentParser, fail, positive_int
from training.run_description import Model


def attention_keys(model: Model, layer_number: int, causal: bool = True) -> float:
    """The keys a query attends to, averaged over the sequence: Megatron's convention counts a
    causal layer as half the s x s scores (s / 2); a banded layer of window W computes the band,
    s W - W^2 / 2 of them (W - W^2 / 2s per query; s / 2 again at W = s), not the triangle."""
    s = model.seq_length
    if causal and model.banded(layer_number):
        window = min(model.sliding_window, s)
        return window - window * window / (2 * s)
    return s / 2 if causal else s


def flops_per_token(model: Model, causal: bool = True) -> float:
    """Training FLOPs per token (forward + backward), Megatron's convention; a sliding window's
    layers count their band only (attention_keys)."""
    h = model.hidden_size
    qkv = 2 * h * (model.q_width + 2 * model.kv_width)
    proj = 2 * model.q_width * h
    # scores and the weighted sum of values: 2 x 2 FLOPs per key and query channel
    attention = sum(4 * attention_keys(model, layer, causal) * model.q_width
                    for layer in range(1, model.num_layers + 1))
    if model.moe:   # active parameters: the router, the top-k experts, a shared expert
        mlp = (2 * h * model.num_experts + 6 * h * model.moe_ffn_hidden_size * model.router_topk
               + 6 * h * model.shared_expert_ffn_hidden_size)
    else:
        mlp = 6 * h * model.ffn_hidden_size
    logits = 2 * h * model.vocab_size
    return 3 * (model.num_layers * (qkv + proj + mlp) + attention + logits)


def peak_tflops(device_name: str | None, precision: str = "bf16") -> float | None:
    """Dense peak TFLOP/s for MFU (training.platforms' table; None when the GPU is not in it):
    fp8/fp4 recipes compute their GEMMs at the fp8 rate."""
    from training.platforms import platform_for_device_name

    platform = platform_for_device_name(device_name) if device_name else None
    if platform is None:
        return None
    return platform.peak_bf16_tflops if precision == "bf16" else platform.peak_fp8_tflops


@dataclass
class StepRecord:
    iteration: int
    step_time_s: float
    tokens: int


def steady_state(records: list[StepRecord], warmup_iters: int, world_size: int,
                 flops_token: float, peak: float | None) -> dict:
    """Harmonic-mean throughput over the iterations after the warm-up window."""
    window = [r for r in records if r.iteration > warmup_iters]
    if not window:
        return {"measured": False, "reason": f"no iteration after the {warmup_iters}-iteration "
                                             "warm-up window"}
    tokens = sum(r.tokens for r in window)
    seconds = sum(r.step_time_s for r in window)
    per_gpu = tokens / seconds / world_size
    tflops = flops_token * per_gpu / 1e12
    times = sorted(r.step_time_s for r in window)
    spread = (times[-1] - times[0]) / (seconds / len(window)) if len(window) > 1 else 0.0
    return {
        "measured": True,
        "iterations": [window[0].iteration, window[-1].iteration],
        "steps": len(window),
        "tokens_per_s_per_gpu": per_gpu,
        "model_tflops_per_gpu": tflops,
        "mfu": tflops / peak if peak else None,
        "peak_tflops": peak,
        "step_time_s_mean": seconds / len(window),
        "step_time_s_min": times[0],
        "step_time_s_max": times[-1],
        "step_time_spread": spread,
    }


class MetricsWriter:
    """Appends one JSON line per logged iteration to <run>/metrics.jsonl (rank 0 only)."""

    def __init__(self, path: Path | None):
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        from training.safe_files import open_write

        with open_write(self.path, "metrics.jsonl", append=True) as f:
            f.write(json.dumps(record, default=str) + "\n")


def read_metrics(path: Path, notes: list[str] | None = None) -> list[dict]:
    """The records of a metrics.jsonl (training.records.MetricsLine each); a last line cut off
    (a run killed or still writing) is left out, said in NOTES; any other problem is a
    RecordError naming the file, line and field."""
    from training.records import MetricsLine, read_lines

    return read_lines(path, MetricsLine, "JSON line", notes)


# -- CLI --------------------------------------------------------------------------------------

def _model_of_preset(model: str, seq_length: int | None, num_layers: int | None) -> Model:
    from training.launch.presets import PRESETS

    by_lower = {name.lower(): p for name, p in PRESETS.items()}
    preset = by_lower.get(model.lower())
    if preset is None:
        raise ValueError(f"unknown model {model!r}: use one of {', '.join(PRESETS)}")
    return Model.of(preset, num_layers, seq_length)


def main(argv: list[str] | None = None, prog: str = "python -m training.metrics") -> int:
    parser = ArgumentParser(prog=prog,
                            description="Model FLOPs of a preset (Megatron's convention).")
    sub = parser.add_subparsers(dest="command", required=True)
    flops = sub.add_parser("flops", help="training FLOPs per token")
    flops.add_argument("--model", required=True, help="preset, e.g. llama3-8B (any case)")
    flops.add_argument("--seq-length", type=positive_int, default=None)
    flops.add_argument("--num-layers", type=positive_int, default=None)
    flops.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    try:
        shape = _model_of_preset(args.model, args.seq_length, args.num_layers)
    except ValueError as err:
        return fail(str(err))
    value = flops_per_token(shape)
    if args.json:
        print(json.dumps({"shape": asdict(shape), "flops_per_token": value}))
    else:
        moe = (f"; MoE: the router and the {shape.router_topk} routed of "
               f"{shape.num_experts} experts per token (Megatron's count plus the router)"
               if shape.moe else "")
        print(f"{args.model}: {shape.num_layers} layers, seq {shape.seq_length}: "
              f"{value / 1e9:.2f} GFLOP/token (training = 3x forward; Megatron's convention: "
              f"GQA, SwiGLU, causal attention counted as half, a sliding window's layers as "
              f"its band, logits included{moe})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
