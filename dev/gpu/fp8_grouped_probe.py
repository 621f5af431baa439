"""Does torch's fp8 grouped GEMM pay on this GPU, at the MoE experts' shapes? (issue 53, fp8 MoE:
a probe before any kernel is built.) One GPU, ~1 min, no TE needed.

For each expert shape (Qwen3-30B-A3B's 128 experts of FFN 768, Mixtral's 8 of 14336, gpt-oss's
32 of 2880) and tokens per step, the forward GEMM of the native grouped experts
(training/native/grouped_experts.py: x [tokens, in] against each expert's weight, offsets
int32) three ways:
  bf16      torch's grouped_mm, what runs today
  fp8       torch._scaled_grouped_mm, e4m3 with rowwise fp32 scales (x per token row, the
            weight per output column), the casts counted
  fp8-mm    the same without the casts (the GEMM alone: what carrying fp8 activations through
            the permutation, and fp8 weights kept between steps, would leave)
Prints each one's time (CUDA events, median of 20 after 5 warm-up calls), its speed-up over bf16
and its error against an fp32 reference (relative Frobenius), or why it cannot run here.

    python3 dev/gpu/fp8_grouped_probe.py [--tokens 32768]
"""
from __future__ import annotations

import argparse
import statistics

import torch

SHAPES = {"qwen3-30B-A3B fc1": (128, 2048, 2 * 768), "qwen3-30B-A3B fc2": (128, 768, 2048),
          "mixtral-8x7B fc1": (8, 4096, 2 * 14336), "mixtral-8x7B fc2": (8, 14336, 4096),
          "gpt-oss-20b fc1": (32, 2880, 2 * 2880), "gpt-oss-20b fc2": (32, 2880, 2880)}
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def _offsets(tokens: int, experts: int, gen) -> torch.Tensor:
    """Uneven tokens per expert (a router's), each a multiple of 16 (the fp8 kernel's rows)."""
    weights = torch.rand(experts, generator=gen) + 0.2
    counts = (weights / weights.sum() * tokens / 16).floor().int() * 16
    counts[0] += tokens - int(counts.sum())
    return torch.cumsum(counts, 0).to(torch.int32).cuda()


def _rowwise(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t in e4m3 with one fp32 scale per slice along `dim` (amax / 448)."""
    amax = t.abs().amax(dim=dim, keepdim=True).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (t.float() / scale).to(FP8), scale.squeeze(dim)


def _time(fn) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def probe(name: str, experts: int, n_in: int, n_out: int, tokens: int, gen) -> None:
    x = torch.randn(tokens, n_in, generator=gen).cuda().bfloat16()
    w = (torch.randn(experts, n_out, n_in, generator=gen) / n_in ** 0.5).cuda().bfloat16()
    offs = _offsets(tokens, experts, gen)
    w_t = w.transpose(1, 2)                         # [E, in, out], column-major in its last two
    bf16 = lambda: torch.nn.functional.grouped_mm(x, w_t, offs=offs)  # noqa: E731
    # an fp32 reference, expert by expert (a loop is fine here: correctness only)
    ends = offs.tolist()
    ref = torch.cat([x[a:b].float() @ w[e].float().T
                     for e, (a, b) in enumerate(zip([0] + ends[:-1], ends))])
    t_bf16 = _time(bf16)
    line = f"{name:20s} E={experts:3d} {n_in:5d}->{n_out:5d} tokens {tokens}: bf16 {t_bf16:7.3f} ms" \
           f" (err {_error(bf16(), ref):.1e})"
    try:
        def cast_and_mm():
            xq, xs = _rowwise(x, 1)                 # per token row
            wq, ws = _rowwise(w, 2)                 # per output row of W (= column of W^T)
            return torch._scaled_grouped_mm(xq, wq.transpose(1, 2), xs, ws, offs=offs,
                                            out_dtype=torch.bfloat16)

        xq, xs = _rowwise(x, 1)
        wq, ws = _rowwise(w, 2)
        mm_only = lambda: torch._scaled_grouped_mm(xq, wq.transpose(1, 2), xs, ws,  # noqa: E731
                                                   offs=offs, out_dtype=torch.bfloat16)
        t_fp8, t_mm = _time(cast_and_mm), _time(mm_only)
        line += (f" | fp8 {t_fp8:7.3f} ms ({t_bf16 / t_fp8:.2f}x, err "
                 f"{_error(cast_and_mm(), ref):.1e}) | fp8-mm {t_mm:7.3f} ms "
                 f"({t_bf16 / t_mm:.2f}x)")
    except (RuntimeError, TypeError) as err:
        line += f" | fp8: cannot run here ({str(err).splitlines()[0][:160]})"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32768,
                        help="routed rows per GEMM (default 32768: 4096 tokens x top-8)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()} "
          f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    gen = torch.Generator().manual_seed(0)
    for name, (experts, n_in, n_out) in SHAPES.items():
        probe(name, experts, n_in, n_out, args.tokens, gen)


if __name__ == "__main__":
    main()
