"""The issue-39 check at the published widths: random-weight Hugging Face folders built from the
real config.json of published models (tests/checkpoint/published.py), layers cut, widths real.

    python dev/check_published_models.py                       # all eleven, 2 layers, bf16
    python dev/check_published_models.py SmolLM2 TinyLlama     # those whose Hub id holds a word
    python dev/check_published_models.py --ours --json out.json

For each: import, export, bitwise round trip, transformers' logits on the export equal to the
source's, and a DRY_RUN from the import whose Megatron arguments (parsed and validated by
Megatron's own code) carry the model's shape; with --ours also our GPTModel built from that
launch, loaded from the import, against transformers (bf16: within 3x HF's own bf16 rounding
error, tests/model/parity.py's yardstick). Memory: an 8B width's 2 layers and 128k-row
embedding need ~10 GB in bf16 (--ours: twice). The CPU suite runs the same steps at test widths
(tests/checkpoint/test_published.py). Exit 1 when one fails; the JSON holds every result.

The record: --json PATH updates PATH with the models run (each with its command, git sha and
time; the machine and versions beside them), so one model a process (the machine's memory)
fills one file: docs/benchmarks/checkpoint_published_cpu.json. `--docs` writes its table into
docs/checkpoints.md between the markers (tests/checkpoint/test_published.py checks it is
current).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RECORD = REPO / "docs" / "benchmarks" / "checkpoint_published_cpu.json"
DOC = REPO / "docs" / "checkpoints.md"
BEGIN, END = "<!-- published-check:begin -->", "<!-- published-check:end -->"
STEPS = (("import", "import"), ("export", "export"), ("bitwise", "bitwise round trip"),
         ("hf_logits_equal", "HF logits equal"), ("dry_run_shape", "DRY_RUN shape"),
         ("ours_vs_hf", "ours vs HF (--ours)"))


def check(config: dict, root: Path, ours: bool, steps: dict) -> dict:
    """Each step of one model, recorded in `steps` as it passes (a failure leaves the steps
    before it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.checkpoint.helpers import assert_bitwise_equal
    from tests.checkpoint.published import (expect_args, launch_config, ours_from_launch,
                                            random_hf_model)
    from tests.launch.helpers import megatron_args
    from tests.model.parity import check_bf16_parity, compare, fp32_logits
    from training.checkpoint.convert import export_checkpoint, import_checkpoint

    start = time.perf_counter()
    hf_model, hf = random_hf_model(root, config, torch.bfloat16)
    steps["random_folder"] = True
    out = root / "megatron"
    import_checkpoint(str(hf), out, progress=False)
    steps["import"] = True
    export_checkpoint(out, root / "back", progress=False)
    steps["export"] = True
    assert_bitwise_equal(hf, root / "back")
    steps["bitwise"] = True
    tokens = torch.randint(0, config["vocab_size"], (1, 16),
                           generator=torch.Generator().manual_seed(0))
    if ours:   # HF's fp32 yardstick before our model is built: one model in fp32 at a time
        reference = fp32_logits(hf_model, tokens)
    else:      # one model in memory at a time (Mixtral's 2 layers: ~6 GB each)
        del hf_model
    logits = []
    with torch.no_grad():   # both as transformers loads them (RoPE frequencies alike)
        for folder in (hf, root / "back"):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
            logits.append(model(input_ids=tokens).logits)
            del model
    assert torch.equal(*logits)
    steps["hf_logits_equal"] = True
    env = {"EXPERIMENT_DIR": str(root / "experiment")}
    result = launch_config(env, config, PRETRAINED_CHECKPOINT=out, NATIVE_KERNELS="torch",
                           TRANSFORMER_IMPL="native")
    expect_args(megatron_args(result), config)
    assert result.settings.setting("MODEL_SIZE").source == "checkpoint"
    steps["dry_run_shape"] = True
    if ours:
        from training.checkpoint.megatron import load_weights

        gpt = ours_from_launch(result, config["vocab_size"], torch.bfloat16)
        load_weights(gpt, out)
        from tests.moe.model import cpu_dispatcher_streams

        with cpu_dispatcher_streams():
            compared = compare(hf_model, gpt.eval(), tokens, reference)
        check_bf16_parity(compared)
        steps["ours_vs_hf"] = {k: round(v, 6) for k, v in compared.items()}
    steps["seconds"] = round(time.perf_counter() - start, 1)
    # this process's peak so far (one model a process: that model's)
    steps["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)
    return steps


def _header() -> dict:
    from training.launch.runfolder import package_versions

    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    return {"what": "dev/check_published_models.py: random-weight Hugging Face folders from "
                    "the real config.json of published models, layers cut, widths real",
            "machine": {"cores": os.cpu_count(), "memory_bytes": total,
                        "platform": platform.platform()},
            "versions": package_versions()}


def _update(path: Path, layers: int, results: dict) -> None:
    """Write the results into the record at `path`, keeping the models not run now."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    if data.get("layers", layers) != layers:
        data["results"] = {}
    stamp = {"command": shlex.join(["python", "dev/check_published_models.py", *sys.argv[1:]]),
             "git_sha": _git_sha(),
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                 timespec="seconds")}
    data.update(_header(), layers=layers)
    data["results"] = {**data.get("results", {}),
                       **{h: {**r, **stamp} for h, r in results.items()}}
    path.write_text(json.dumps(data, indent=1) + "\n")


def _git_sha():
    from training.launch.runfolder import git_sha

    return git_sha(REPO)


def render(data: dict) -> str:
    """docs/checkpoints.md's table of the record: each published model, each step."""
    from tests.checkpoint.published import PUBLISHED

    lines = ["| model | " + " | ".join(label for _, label in STEPS) + " | seconds | commit |",
             "|---" * (len(STEPS) + 3) + "|"]
    results = data.get("results", {})
    for hub_id in PUBLISHED:
        r = results.get(hub_id)
        if r is None:
            lines.append(f"| {hub_id} | " + " | ".join("not run" for _ in STEPS) + " | | |")
            continue
        cells, failed = [], False
        for key, _ in STEPS:
            value = r.get(key)
            if isinstance(value, dict) and value["max_abs_err"] == 0:
                cells.append("pass (bit-equal to HF's bf16 logits)")
            elif isinstance(value, dict):   # ours vs HF: our bf16 error over HF's own
                cells.append(f"pass ({value['mean_abs_err'] / value['baseline_abs_err']:.2f}x "
                             "HF's bf16 error)")
            elif value is True:
                cells.append("pass")
            elif r["ok"] or failed:       # not asked for (--ours), or after the failing step
                cells.append("not run")
            else:                         # a failed model stops at its first failing step
                cells.append("**fail**")
                failed = True
        sha = (r.get("git_sha") or "?")[:7]
        lines.append(f"| {hub_id} | " + " | ".join(cells) +
                     f" | {r.get('seconds', '')} | {sha} |")
    passed = [h for h in PUBLISHED if results.get(h, {}).get("ok")]
    return (f"{len(passed)} of {len(PUBLISHED)} pass at their published widths, "
            f"{data.get('layers')} layers, bf16 (recorded in [docs/benchmarks/{RECORD.name}]"
            f"(benchmarks/{RECORD.name})):\n\n" + "\n".join(lines))


def docs_block(data: dict) -> str:
    return f"{BEGIN}\n{render(data)}\n{END}"


def write_docs(record: Path = RECORD, doc: Path = DOC) -> None:
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(head + docs_block(json.loads(record.read_text())) + tail)


def main(argv: list[str] | None = None) -> int:
    from tests.checkpoint.published import PUBLISHED, cut

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="only the models whose Hub id holds one")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ours", action="store_true", help="also our model's logits")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"update this record with the results (the docs': {RECORD.name})")
    parser.add_argument("--docs", action="store_true",
                        help="write the record's table into docs/checkpoints.md, run nothing")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(args.json or RECORD)
        return 0
    chosen = [h for h in PUBLISHED if not args.words or any(w in h for w in args.words)]
    results, failed = {}, 0
    for hub_id in chosen:
        steps: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                check(cut(PUBLISHED[hub_id], args.layers), Path(tmp), args.ours, steps)
                results[hub_id] = {"ok": True, **steps}
            except Exception as err:   # a check script: report every model, then fail
                failed += 1
                results[hub_id] = {"ok": False, **steps, "error": f"{type(err).__name__}: {err}",
                                   "traceback": traceback.format_exc()[-3000:]}
        print(f"{hub_id}: {'ok' if results[hub_id]['ok'] else results[hub_id]['error']}",
              flush=True)
    if args.json:
        _update(args.json, args.layers, results)
    print(f"{len(chosen) - failed} of {len(chosen)} pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
