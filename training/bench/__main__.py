"""`python -m training.bench peers` and `python -m training.bench table`.

peers   our launcher's default vs Megatron's local spec vs Hugging Face LlamaForCausalLM (SDPA)
        with and without Liger-Kernel, at one shape, in one invocation; writes
        docs/benchmarks/<name>.json and prints the ratio table.
table   the markdown table of a benchmark JSON (docs are generated from the JSONs).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from . import record
from .ours import run_point
from .table import peers_table


def _ours_toggles(args, backend: str) -> dict[str, str]:
    return {"MODEL_SIZE": args.model_size, "NUM_LAYERS": str(args.num_layers),
            "SEQ_LENGTH": str(args.seq_length), "MBS": str(args.mbs),
            "BS": str(args.global_batch), "TOTAL_ITERS": str(args.warmup + args.steps),
            "METRICS_WARMUP_ITERS": str(args.warmup), "EVAL_ITERS": "0",
            "TRANSFORMER_IMPL": backend, "GPUS_PER_NODE": "1"}


def _hf_point(args, label: str, liger: bool, work: Path) -> dict:
    out = work / f"{label}.json"
    log = work / f"{label}.log"
    preset = {"8B": "llama3-8B", "70B": "llama3-70B", "3.1-8B": "llama3.1-8B"}[args.model_size]
    cmd = [sys.executable, "-m", "training.bench.hf_peer", "--model", preset,
           "--num-layers", str(args.num_layers), "--seq-length", str(args.seq_length),
           "--mbs", str(args.mbs), "--global-batch", str(args.global_batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--json-out", str(out)]
    if liger:
        cmd.append("--liger")
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=record.REPO)
    point = {"label": label, "side": "peer", "command": cmd[1:], "returncode": proc.returncode}
    if proc.returncode == 0 and out.exists():
        point.update(json.loads(out.read_text()))
    else:
        point["error"] = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
    return point


def cmd_peers(args) -> int:
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-peers-"))
    result = record.header(args.name)
    result["kind"] = "peers"
    result["shape"] = {"model": args.model_size, "num_layers": args.num_layers,
                       "seq_length": args.seq_length, "mbs": args.mbs,
                       "global_batch": args.global_batch, "dtype": "bf16", "gpus": 1,
                       "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats}
    points = []
    sides = [s for s in args.sides.split(",") if s]
    for repeat in range(args.repeats):
        for side in sides:
            label = f"{side}-r{repeat}"
            print(f"[bench] {label} ...", flush=True)
            if side in ("native", "local", "transformer_engine"):
                point = run_point(label, _ours_toggles(args, side), work / "experiment",
                                  work / "logs")
                point["side"] = "ours" if side == "native" else f"megatron-{side}"
            elif side in ("hf", "hf_liger"):
                point = _hf_point(args, label, side == "hf_liger", work)
            else:
                raise SystemExit(f"unknown side {side!r}")
            point["name"], point["repeat"] = side, repeat
            points.append(point)
            print(f"[bench] {label}: {point.get('tokens_per_s_per_gpu') or point.get('error', '')[-300:]}",
                  flush=True)
    result["points"] = points
    out = record.write(result, Path(args.out) if args.out else
                       record.BENCH_DIR / f"{args.name}.json")
    print(peers_table(result))
    print(f"[bench] wrote {out}")
    return 0


def cmd_table(args) -> int:
    data = json.loads(Path(args.json).read_text())
    print(peers_table(data))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    peers = sub.add_parser("peers", help="ours vs Megatron local vs HF (+Liger)")
    peers.add_argument("--name", default="peers_h200_llama3-8B-8L_seq8192")
    peers.add_argument("--model-size", default="8B")
    peers.add_argument("--num-layers", type=int, default=8)
    peers.add_argument("--seq-length", type=int, default=8192)
    peers.add_argument("--mbs", type=int, default=1)
    peers.add_argument("--global-batch", type=int, default=8)
    peers.add_argument("--steps", type=int, default=15)
    peers.add_argument("--warmup", type=int, default=5)
    peers.add_argument("--repeats", type=int, default=1)
    peers.add_argument("--sides", default="native,local,hf,hf_liger")
    peers.add_argument("--work-dir", default=None)
    peers.add_argument("--out", default=None)
    peers.set_defaults(fn=cmd_peers)
    table = sub.add_parser("table", help="markdown table of a benchmark JSON")
    table.add_argument("json")
    table.set_defaults(fn=cmd_table)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
