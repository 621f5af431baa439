"""Time the experts' fused weight-gradient kernel (MOE_WGRAD_FUSION) per tile configuration,
against the unfused path it replaces, at the MoE families' expert shapes.

For each shape, one projection of one micro-batch (rows = tokens x top-k, split over the experts
by a seeded multinomial draw, so the experts are unevenly loaded as in a run):

  fused  training/native/grouped_wgrad.triton_accumulate_ at each configuration in CONFIGS
         (the run's default first; then the pointer kernel and the TMA kernel at several tiles,
         with and without Triton's warp specialization): main_grad += dY^T X per expert;
  torch  torch's grouped GEMM for the weight gradient (grouped_mm on dY^T and X, the groups
         along the rows) and an add into main_grad: what the native experts do without the
         fusion.

Session 16's gpt-oss profile put the fused kernel near 460 TFLOP/s where the grouped GEMM's
forward ran near 680 at the same widths; Mixtral-8x7B cut to 4 layers ran 0.962x the compiled
HF peer. This settles whether a larger tile, or the unfused path, is faster at which width.

Each repeat times every configuration once, in a rotated order; a sample is the mean time of
`iters` calls between CUDA events. The results are checked against an fp32 reference
(the largest error relative to the largest gradient). The JSON (training.bench.record's
header: command, git sha, GPU, driver, versions; every sample) goes to
<out-dir>/kernels-moe-wgrad_<gpu>.json.

    python -m training.native.wgrad_timing --out-dir docs/benchmarks      (GPU machine)
    python -m training.native.wgrad_timing --table docs/benchmarks/kernels-moe-wgrad_h200.json
        (the table in docs/moe.md, from that JSON; --check: is it current)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from . import grouped_wgrad
from .op_timing import Timer, gpu_tag, rotated_samples, timing_parser

NAME = "kernels-moe-wgrad"


@dataclass(frozen=True)
class WgradShape:
    """One expert projection's weight gradient: [experts, out, in] from `rows` grouped rows."""
    name: str
    experts: int
    out: int
    inp: int
    rows: int

    def flops(self) -> float:
        return 2.0 * self.rows * self.out * self.inp


# fc1 (gate and up, 2 x FFN out of hidden) and fc2 (hidden out of FFN) of each MoE family, one
# micro-batch at the bench shapes (training/bench/catalog.py): seq 4096 (gpt-oss 8192), MBS 1
SHAPES = (
    WgradShape("qwen3-30B-A3B fc1", 128, 1536, 2048, 4096 * 8),
    WgradShape("qwen3-30B-A3B fc2", 128, 2048, 768, 4096 * 8),
    WgradShape("gpt-oss-20b fc1", 32, 5760, 2880, 8192 * 4),
    WgradShape("gpt-oss-20b fc2", 32, 2880, 2880, 8192 * 4),
    WgradShape("mixtral-8x7B fc1", 8, 28672, 4096, 4096 * 2),
    WgradShape("mixtral-8x7B fc2", 8, 4096, 14336, 4096 * 2),
)

def _config(kernel: str, blocks: tuple[int, int, int], warps: int, stages: int,
            warp_specialize: bool = False) -> tuple:
    """(label, blocks, launch, kernel, warp specialization) of one configuration."""
    label = f"{kernel} {'x'.join(map(str, blocks))} w{warps} s{stages}" + (
        " ws" if warp_specialize else "")
    return label, blocks, {"num_warps": warps, "num_stages": stages}, kernel, warp_specialize


# the run's configuration (grouped_wgrad.KERNEL with its blocks and launch) first, as "default"
CONFIGS = (
    ("default", None, None, None, False),
    _config("pointer", (128, 128, 64), 8, 3),   # the pointer kernel's own default
    _config("pointer", (128, 256, 64), 8, 3),
    _config("pointer", (128, 128, 32), 4, 5),
    _config("tma", (128, 128, 64), 8, 3),
    _config("tma", (128, 128, 64), 8, 4),
    _config("tma", (128, 128, 64), 8, 2),
    _config("tma", (128, 128, 64), 4, 3),
    _config("tma", (128, 64, 64), 4, 4),
    _config("tma", (128, 256, 64), 8, 3),
    _config("tma", (256, 128, 64), 8, 3),
    _config("tma", (128, 128, 64), 4, 4, warp_specialize=True),
    _config("tma", (128, 256, 64), 8, 3, warp_specialize=True),
)


def inputs(shape: WgradShape, device, dtype=torch.bfloat16, seed: int = 0):
    """x [rows, in], dy [rows, out], the experts' end rows (int32, on the device), a zero
    main_grad [experts, out, in] in dtype."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.multinomial(torch.ones(shape.experts), shape.rows, replacement=True,
                               generator=gen).bincount(minlength=shape.experts)
    ends = torch.cumsum(counts, 0).to(torch.int32).to(device)
    x = torch.randn(shape.rows, shape.inp, generator=gen).to(device, dtype)
    dy = torch.randn(shape.rows, shape.out, generator=gen).to(device, dtype)
    grad = torch.zeros(shape.experts, shape.out, shape.inp, device=device, dtype=dtype)
    return x, dy, ends, grad


def unfused_(grad, x, dy, ends) -> None:
    """The weight gradient by torch's grouped GEMM (CUDA), then added into main_grad."""
    grad.add_(torch.nn.functional.grouped_mm(dy.t(), x, offs=ends))


def implementations(device) -> dict:
    """name -> fn(grad, x, dy, ends); on the CPU only the torch loop (the plumbing's tests)."""
    if device.type != "cuda":
        return {"torch loop": grouped_wgrad.torch_accumulate_}
    impls = {f"fused {label}": (lambda g, x, dy, e, b=blocks, lc=launch, k=kernel, w=ws:
                                grouped_wgrad.triton_accumulate_(g, x, dy, e, b, lc, k, w))
             for label, blocks, launch, kernel, ws in CONFIGS}
    impls["torch grouped_mm + add"] = unfused_
    return impls


def max_error(fn, shape: WgradShape, device) -> float:
    """max |fn's main_grad - fp32 reference| / max |reference|, from a zero buffer."""
    x, dy, ends, grad = inputs(shape, device)
    fn(grad, x, dy, ends)
    ref = torch.zeros(grad.shape, dtype=torch.float32, device=device)
    grouped_wgrad.torch_accumulate_(ref, x, dy, ends)
    return ((grad.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def measure(shape: WgradShape, device, repeats: int, iters: int, warmup: int) -> dict:
    from training.bench.stats import effect, summarize

    impls = implementations(device)
    x, dy, ends, grad = inputs(shape, device)
    timer = Timer(device)
    steps = {name: (lambda fn=fn: fn(grad, x, dy, ends)) for name, fn in impls.items()}
    failed = {}
    for name, step in list(steps.items()):      # Triton compiles, the allocator settles
        try:
            timer(step, max(warmup, 1))
        except Exception as err:  # noqa: BLE001 - a tile that does not compile is a result
            failed[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            del steps[name], impls[name]
    names = list(steps)
    samples = rotated_samples(steps, timer, repeats, iters)
    baseline = names[0]
    per_s = {name: dict(enumerate(1e3 / ms for ms in values)) for name, values in samples.items()}
    return {
        "shape": vars(shape) | {"counts_seed": 0}, "dtype": "bf16", "iters_per_sample": iters,
        "ms": samples, "summary_ms": {name: summarize(v) for name, v in samples.items()},
        "tflops": {name: shape.flops() / (summarize(v)["mean"] * 1e-3) / 1e12
                   for name, v in samples.items()},
        "max_rel_error": {name: max_error(fn, shape, device) for name, fn in impls.items()},
        "baseline": baseline, "failed": failed,
        "vs_baseline": {name: effect(per_s[name], per_s[baseline])
                        for name in names if name != baseline},
        "ratio_of": "calls per second, configuration over the baseline (the kernel's default)",
    }


def run(argv: list[str] | None = None) -> Path:
    from training.bench import record
    from training.bench.stats import VERDICT_RULE

    parser = timing_parser("python -m training.native.wgrad_timing", __doc__, iters=10, warmup=2)
    parser.add_argument("--shapes", default=None,
                        help="comma-separated words a shape's name must contain (default: all; "
                             "e.g. mixtral,gpt-oss)")
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.shapes.split(",")] if args.shapes else None
    shapes = [s for s in SHAPES if not wanted or any(w in s.name for w in wanted)]
    if not shapes:
        parser.error(f"--shapes {args.shapes!r} matches none of: "
                     + ", ".join(s.name for s in SHAPES))
    result = record.header(NAME, argv if argv is not None else sys.argv[1:],
                           module="training.native.wgrad_timing")
    result.update({"verdict_rule": VERDICT_RULE, "device": str(args.device), "shapes": {}})
    for shape in shapes:
        measured = measure(shape, args.device, args.repeats, args.iters, args.warmup)
        result["shapes"][shape.name] = measured
        print(f"{shape.name}: " + ", ".join(
            f"{name} {measured['summary_ms'][name]['mean']:.3f} ms "
            f"({measured['tflops'][name]:.0f} TFLOP/s, err {measured['max_rel_error'][name]:.1e})"
            for name in measured["ms"]), flush=True)
    out = record.write(result, args.out_dir / f"{NAME}_{gpu_tag(args.device)}.json")
    print(f"wrote {out}")
    return out


def table(data: dict) -> str:
    """The markdown table of one kernels-moe-wgrad JSON: a row per configuration, a column per
    shape, the mean milliseconds per call with TFLOP/s; the fastest of each column in bold."""
    shapes = data["shapes"]
    names = list(next(iter(shapes.values()))["summary_ms"])
    fastest = {s: min(v["summary_ms"], key=lambda n: v["summary_ms"][n]["mean"])
               for s, v in shapes.items()}
    lines = ["| configuration | " + " | ".join(shapes) + " |",
             "|---|" + "---|" * len(shapes)]
    for name in names:
        cells = []
        for shape, v in shapes.items():
            if name not in v["summary_ms"]:
                cells.append(v["failed"].get(name, "-")[:40])
                continue
            cell = f"{v['summary_ms'][name]['mean']:.3f} ms ({v['tflops'][name]:.0f})"
            cells.append(f"**{cell}**" if fastest[shape] == name else cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    first = next(iter(shapes.values()))
    lines += ["", f"Mean of {len(first['ms'][names[0]])} samples of {first['iters_per_sample']} "
              f"calls each (TFLOP/s in brackets); `{data['command']}`, git {data['git_sha'][:7]}, "
              f"{data['gpu']['name']}, created {data['created']}. \"default\" is the run's "
              "kernel at that commit."]
    return "\n".join(lines)


def render_page(source: Path, page: Path, check: bool = False) -> int:
    """Fill the page's <!-- kernels-moe-wgrad --> block from the JSON (--check: exit 1 if it
    is stale). The JSON is read and its table made once, before the page is touched."""
    from training.launch import docs
    from training.reading import read_json

    text = table(read_json(source, f"{NAME} JSON"))
    return docs.main((["--check"] if check else []) + ["--page", str(page)],
                     {NAME: lambda: text},
                     prog=f"python -m training.native.wgrad_timing --table {source}")


def _table_main(argv: list[str]) -> int:
    from training.cli import ArgumentParser

    parser = ArgumentParser(prog="python -m training.native.wgrad_timing --table")
    parser.add_argument("--table", type=Path, required=True, help="a kernels-moe-wgrad JSON")
    parser.add_argument("--page", type=Path, default=Path("docs/moe.md"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if not args.table.is_file():
        parser.error(f"--table {args.table}: no such file")
    try:
        return render_page(args.table, args.page, args.check)
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as err:
        parser.error(f"--table {args.table}: not a {NAME} JSON ({type(err).__name__}: "
                     f"{str(err)[:120]})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(word == "--table" or word.startswith("--table=") for word in argv):
        return _table_main(argv)
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
