"""Time the native backend's Liger-path ops against Liger-Kernel's own Megatron integration.

For the two ops both provide (training.native.IMPLEMENTATION picks one per op), each
implementation runs forward + backward on the same input, exactly as the patch table or the
spec would put it into Megatron:
  rmsnorm  ours: norm.LigerRMSNorm (Liger's Triton kernel through liger_rms_norm);
           liger_megatron: liger_kernel.megatron.LigerMegatronRMSNorm;
           torch_fused: norm.FusedTorchRMSNorm (torch's fused rms_norm kernel);
           torch: norm.NativeRMSNorm (NATIVE_KERNELS=torch), for scale
  swiglu   ours: swiglu.bias_swiglu (one Triton pass each way);
           liger_megatron: liger_kernel.megatron.LigerMegatronSwiGLU (fused gate-up kernel);
           megatron: Megatron's bias_swiglu_impl (torch-compiled), for scale
at Llama3-8B's shapes (MBS 1, seq 8192: 8192 tokens x hidden 4096, ffn 14336) in bf16.

Each repeat times every implementation once, in a rotated order; a sample is the mean time of
`iters` forward+backward passes between CUDA events. Ratios against ours use the harness's
rule (training.bench.stats: VERDICT_RULE, on passes per second). Peak memory beyond the
inputs is recorded per implementation. The JSON (training.bench.record's header: command, git
sha, GPU, driver, versions) goes to <out-dir>/kernels-liger-megatron_<gpu>.json.

    python -m training.native.op_timing --out-dir docs/benchmarks
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from training.cli import ArgumentParser, nonnegative_int, positive_int

NAME = "kernels-liger-megatron"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class OpCase:
    op: str
    shape: tuple[int, ...]
    impls: dict[str, Callable]     # name -> fn(x) -> output
    baseline: str = "ours"


def _norm_config(dtype):
    return SimpleNamespace(normalization="RMSNorm", sequence_parallel=False,
                           layernorm_zero_centered_gamma=False, params_dtype=dtype)


def cases(tokens: int, hidden: int, ffn: int, dtype, device) -> list[OpCase]:
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    from training.native import norm, swiglu

    if device.type != "cuda":  # tests: torch.compile of Megatron's function takes minutes there
        def bias_swiglu_impl(x, bias, fp8_input_store=False, cpu_offload_input=False):
            return swiglu.swiglu_torch(x)

    config = _norm_config(dtype)
    norms = {"ours": norm.LigerRMSNorm(config, hidden),
             "liger_megatron": norm.liger_megatron_rms_norm()(config, hidden),
             "torch_fused": norm.FusedTorchRMSNorm(config, hidden),
             "torch": norm.NativeRMSNorm(config, hidden)}
    norms = {name: module.to(device=device, dtype=dtype) for name, module in norms.items()}
    slots = {"ours": swiglu.bias_swiglu(bias_swiglu_impl),
             "liger_megatron": swiglu.liger_megatron_bias_swiglu(bias_swiglu_impl),
             "megatron": bias_swiglu_impl}
    return [
        OpCase("rmsnorm", (tokens, hidden), dict(norms)),
        OpCase("swiglu", (tokens, 2 * ffn),
               {name: (lambda x, fn=fn: fn(x, None)) for name, fn in slots.items()}),
    ]


class Timer:
    """Mean milliseconds of `iters` calls: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, step: Callable[[], None], iters: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                step()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters
        begin = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - begin) * 1e3 / iters


def rotated_samples(steps: dict[str, Callable[[], None]], timer: "Timer", repeats: int,
                    iters: int) -> dict[str, list[float]]:
    """name -> one mean time per repeat; each repeat times every step once, the order rotated
    by one each repeat (drift hits every step alike)."""
    names = list(steps)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(timer(steps[name], iters))
    return samples


def timing_parser(prog: str, doc: str, iters: int, warmup: int) -> ArgumentParser:
    """The kernel timings' common arguments: where the JSON goes, repeats, calls a sample,
    warm-up calls, the device."""
    from training.bench import record

    parser = ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=record.BENCH_DIR)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--iters", type=positive_int, default=iters)
    parser.add_argument("--warmup", type=nonnegative_int, default=warmup)
    parser.add_argument("--device", type=_device,
                        default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def _fwd_bwd(fn: Callable, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], None]:
    def step():
        x.grad = None
        torch.autograd.backward(fn(x), grad)

    return step


def peak_extra_mib(step: Callable[[], None], device: torch.device) -> float | None:
    """GPU memory one forward+backward allocates beyond what is live before it."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def measure(case: OpCase, dtype, device, repeats: int, iters: int, warmup: int) -> dict:
    from training.bench.stats import effect, summarize

    torch.manual_seed(0)
    x = torch.randn(*case.shape, device=device, dtype=dtype, requires_grad=True)
    with torch.no_grad():
        out_shape = case.impls[case.baseline](x).shape
    grad = torch.randn(out_shape, device=device, dtype=dtype)
    steps = {name: _fwd_bwd(fn, x, grad) for name, fn in case.impls.items()}
    timer = Timer(device)
    for step in steps.values():                  # Triton compiles, autotuning, allocator
        timer(step, warmup)
    names = list(steps)
    samples = rotated_samples(steps, timer, repeats, iters)
    result = {
        "shape": list(case.shape), "dtype": str(dtype).replace("torch.", ""),
        "pass": "forward + backward", "iters_per_sample": iters, "ms": samples,
        "summary_ms": {name: summarize(values) for name, values in samples.items()},
        "peak_extra_mib": {name: peak_extra_mib(step, device) for name, step in steps.items()},
        "baseline": case.baseline,
        "ratio_of": "forward+backward passes per second, implementation over the baseline "
                    "(the harness's tokens_per_s_ratio field)",
    }
    per_s = {name: {r: 1e3 / ms for r, ms in enumerate(values)}
             for name, values in samples.items()}
    result["vs_baseline"] = {name: effect(per_s[name], per_s[case.baseline])
                             for name in names if name != case.baseline}
    return result


def gpu_tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    from training.platforms import platform_for_device_name

    platform = platform_for_device_name(torch.cuda.get_device_name())
    return platform.name if platform else "gpu"


def _device(text: str) -> torch.device:
    try:
        return torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (cuda, cuda:1, cpu)") from None


def run(argv: list[str] | None = None) -> Path:
    from training.bench import record
    from training.bench.stats import VERDICT_RULE
    from training.native import IMPLEMENTATION

    parser = timing_parser("python -m training.native.op_timing", __doc__, iters=20, warmup=3)
    parser.add_argument("--tokens", type=positive_int, default=8192, help="MBS x seq (Llama3-8B: 8192)")
    parser.add_argument("--hidden", type=positive_int, default=4096)
    parser.add_argument("--ffn", type=positive_int, default=14336)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    args = parser.parse_args(argv)
    device = args.device
    dtype = DTYPES[args.dtype]
    result = record.header(NAME, argv if argv is not None else sys.argv[1:],
                           module="training.native.op_timing")
    result.update({"verdict_rule": VERDICT_RULE, "implementation_in_use": dict(IMPLEMENTATION),
                   "device": str(device), "ops": {}})
    for case in cases(args.tokens, args.hidden, args.ffn, dtype, device):
        result["ops"][case.op] = measure(case, dtype, device, args.repeats, args.iters,
                                         args.warmup)
        line = ", ".join(f"{name} {s['mean']:.3f} ms"
                         for name, s in result["ops"][case.op]["summary_ms"].items())
        verdicts = ", ".join(f"{name}: {e['tokens_per_s_ratio']:.3f}x ours, {e['verdict']}"
                             for name, e in result["ops"][case.op]["vs_baseline"].items())
        print(f"{case.op} {case.shape}: {line} | {verdicts}", flush=True)
    out = record.write(result, args.out_dir / f"{NAME}_{gpu_tag(device)}.json")
    print(f"wrote {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
