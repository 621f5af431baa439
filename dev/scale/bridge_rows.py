"""Rows of Megatron-Bridge's published pre-training performance tables, as references.

    python dev/scale/bridge_rows.py <Megatron-Bridge git dir> > rows.json

Reads docs/performance-summary.md and docs/performance-summary-archive.md at the commit named
in RELEASES (git show, no checkout), parses every pre-training table row of a model this
launcher has a preset for, and prints them as docs/scale/references.json entries: each figure
copied as published (the cell's text, parsed as a number, never rounded), with the file, commit,
release heading, table and row. Rows whose figure the page itself flags (a footnoted known
regression) or whose precision the table does not state are left out and listed with why.
A one-off provenance tool: the JSON it printed was merged into docs/scale/references.json.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

REPO_URL = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob"
COMMIT = "4ab94dfad36641cabdeb96452b21bf676aac4772"   # 2026-08-11, the 26.08 summary
# release -> date its table was published (the commit that added it)
RELEASES = {"25.11": "2025-12-04", "26.02": "2026-02-26", "26.02.01": "2026-03-21",
            "26.04": "2026-04-17", "26.04.01": "2026-05-16", "26.06": "2026-06-16",
            "26.06.01": "2026-07-22", "26.08": "2026-08-11"}
MODELS = {"LLAMA3_8B": ("llama3", "8B"), "LLAMA3_70B": ("llama3", "70B"),
          "LLAMA3.1_405B": ("llama3", "3.1-405B"), "GPT OSS 120B": ("gpt_oss", "120b"),
          "Qwen3_30B_a3B": ("qwen3_moe", "30B-A3B"), "Qwen3_235B_a22B": ("qwen3_moe", "235B-A22B")}
PRECISION = {"FP8": "fp8_tensorwise", "FP8-CS": "fp8_tensorwise", "MXFP8": "mxfp8",
             "FP8-MX": "mxfp8", "NVFP4": "nvfp4", "BF16": "bf16"}
SYSTEMS = {"DGX-GB300": ("gb300", 4), "DGX-GB200": ("gb200", 4), "DGX-B300": ("b300", 8),
           "DGX-B200": ("b200", 8), "DGX-H100": ("h100", 8)}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(text: str) -> float:
    return float(re.sub(r"\[\^[^\]]*\]", "", text).replace(",", ""))


def parse(text: str, path: str):
    release = section = system = model = None
    header: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if m := re.match(r"## (\S+) NeMo Container", line):
            release, section = m.group(1), None
        elif line.startswith("### "):
            section = line[4:].strip()
        elif m := re.match(r"#### (System|Model): (.+)", line):
            kind, name = m.groups()
            system, model = (name.strip(), None) if kind == "System" else (None, name.strip())
        elif line.startswith("|") and release in RELEASES and section == "Pre-Training Performance":
            row = cells(line)
            if row[0] in ("Model", "System"):
                header = row
                continue
            if set(line) <= set("|- "):
                continue
            yield release, n, dict(zip(header, row)), system, model, path


def rows(git_dir: str):
    out, skipped = [], []
    for path in ("docs/performance-summary.md", "docs/performance-summary-archive.md"):
        text = subprocess.run(["git", "-C", git_dir, "show", f"{COMMIT}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        for release, line, r, system, model, path in parse(text, path):
            model = model or r.get("Model", "").strip()
            system = system or r.get("System")
            where = f"{REPO_URL}/{COMMIT}/{path}#L{line}"
            if model not in MODELS or system not in SYSTEMS:
                continue
            tokens, tflops = r["Tokens / sec / GPU"], r["Model TFLOP / sec / GPU"]
            precisions = r.get("Precision", "")
            if "[^" in tokens + tflops:
                skipped.append(f"{where}: {model} {system} {precisions}: footnoted on the page "
                               f"({tokens} / {tflops})")
                continue
            # 25.11: "FP8-CS (FP8-MX)" with "37556 (36108)": two figures in one cell
            names = re.findall(r"[A-Z0-9-]+", precisions)
            values = re.findall(r"[\d,.]+", tokens)
            flops = re.findall(r"[\d,.]+", tflops)
            for i, name in enumerate(names):
                out.append(entry(release, where, model, system, name, r, values[i], flops[i]))
    return out, skipped


def entry(release, where, model, system, precision, r, tokens, tflops):
    family, size = MODELS[model]
    platform, per_node = SYSTEMS[system]
    gpus = int(r["#-GPUs"])
    words = [f"MODEL_SIZE={size}", f"PLATFORM={platform}", f"NNODES={max(gpus // per_node, 1)}",
             f"GPUS_PER_NODE={min(per_node, gpus)}", f"BS={r['GBS']}", f"MBS={r['MBS']}",
             f"SEQ_LENGTH={r['Sequence Length']}", f"PRECISION={PRECISION[precision]}"]
    for key in ("TP", "PP", "CP", "EP"):
        if r.get(key, "n/a") not in ("n/a", "1", ""):
            words.append(f"{key}={r[key]}")
    fsdp = r.get("FSDP", "0")
    if fsdp not in ("0", "n/a", ""):
        words.append("FSDP=1")
    if family != "gpt_oss":
        words.append("TRANSFORMER_IMPL=transformer_engine")
    vp = r.get("VP", "n/a")
    layout = ", ".join(f"{k} {r[k]}" for k in ("FSDP", "TP", "PP", "CP", "VP", "EP", "GA")
                       if k in r)
    tag = f"bridge{release.replace('.', '')}-{size.lower()}-{platform}-{PRECISION[precision]}"
    ref = {"id": tag, "family": family,
           "source": f"Megatron-Bridge performance summary, {release} NeMo container, "
                     f"pre-training, {model}, {system}, {precision} ({where})",
           "published": RELEASES[release], "container": f"nemo:{release}",
           "setup": f"{gpus} {platform.upper()}, GBS {r['GBS']}, MBS {r['MBS']}, seq "
                    f"{r['Sequence Length']}, {layout}",
           "words": words, "tokens_per_s_per_gpu": number(tokens),
           "model_tflops_per_gpu": number(tflops)}
    if vp not in ("n/a", "1", ""):
        ref["vpp"] = int(vp)
    return ref


if __name__ == "__main__":
    found, left_out = rows(sys.argv[1])
    seen: dict[str, int] = {}
    for ref in found:     # the same model/system/precision twice in one release: number them
        n = seen[ref["id"]] = seen.get(ref["id"], 0) + 1
        if n > 1:
            ref["id"] += f"-{n}"
    json.dump({"references": found, "left_out": left_out}, sys.stdout, indent=1)
