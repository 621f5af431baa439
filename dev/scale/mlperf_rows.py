"""MLPerf Training llama31_8b results as throughput references.

    python dev/scale/mlperf_rows.py <training_results_v5.1 git dir> > rows.json

For each submission in SUBMISSIONS (8-GPU systems whose configuration file names the recipe):
every result_N.txt's timed run (run_start to run_stop) less its evaluations (each eval_start
to eval_stop), the samples trained (the last samples_count logged), the log's global batch and
sequence length; tokens/s/GPU = samples x sequence / training seconds / GPUs, the median over
the submission's runs. Figures derived from the published logs by this arithmetic, not typed;
the precision and micro-batch are read from the configuration file named beside each. A one-off
provenance tool: its output was merged into docs/scale/references.json.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys

REPO_URL = "https://github.com/mlcommons/training_results_v5.1/blob"
# results dir, configuration file, platform, nodes x GPUs per node
SUBMISSIONS = [
    ("NVIDIA/results/tyche_ngpu8_ngc25.09_nemo/llama31_8b",
     "NVIDIA/benchmarks/llama31_8b/implementations/nemo/config_GB200_2x4x2xtp1pp1cp1_8b_fp4.sh",
     "gb200", 2, 4),
    ("NVIDIA/results/theia_ngpu8_ngc25.09_nemo/llama31_8b",
     "NVIDIA/benchmarks/llama31_8b/implementations/nemo/config_GB300_2x4x2xtp1pp1cp1_8b_fp4.sh",
     "gb300", 2, 4),
    ("Dell/results/1xXE9680Lx8B200-SXM-180GB/llama31_8b",
     "Dell/benchmarks/llama31_8b/implementations/nemo/config_1xXE9680Lx8B200-SXM-180GB.sh",
     "b200", 1, 8),
    ("Dell/results/1xXE9780x8B300-SXM-270GB/llama31_8b",
     "Dell/benchmarks/llama31_8b/implementations/nemo/"
     "config_XE9780x8B300-SXM-270GB_1x8x2xtp1pp1cp1_8b.sh", "b300", 1, 8),
    ("AMD/results/MI355X_EPYC_9575F_pytorch/llama31_8b",
     "AMD/benchmarks/llama31_8b/implementations/MI355X_EPYC_9575F_pytorch_llama3_8b/"
     "config_MI355X_1x8x1_8b.sh", "mi355x", 1, 8),
]


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True,
                          text=True).stdout


def events(text: str):
    for line in text.splitlines():
        if ":::MLLOG" in line:
            yield json.loads(line.split(":::MLLOG", 1)[1])


def run_throughput(text: str, gpus: int) -> tuple[float, dict]:
    start = stop = None
    evals, samples, gbs, seq = 0.0, 0, None, None
    opened = None
    for e in events(text):
        key, t, meta = e["key"], e["time_ms"], e.get("metadata") or {}
        if key == "run_start":
            start = t
        elif key == "run_stop":
            stop = t
        elif key == "eval_start":
            opened = t
        elif key == "eval_stop" and opened is not None:
            evals += t - opened
            opened = None
        elif key == "global_batch_size":
            gbs = int(e["value"])
        elif key == "max_sequence_length":
            seq = int(e["value"])
        if isinstance(meta.get("samples_count"), (int, float)):
            samples = max(samples, int(meta["samples_count"]))
    train_s = (stop - start - evals) / 1000
    return samples * seq / train_s / gpus, {"gbs": gbs, "seq": seq, "samples": samples,
                                            "train_s": train_s, "minutes": (stop - start) / 6e4}


def software_date(framework: str) -> str:
    """The software's date from the system description's framework: NeMo's YY.MM release, else
    a nightly's YYYYMMDD."""
    if m := re.search(r"Nemo(?: Framework Release)? (\d\d)\.(\d\d)", framework, re.I):
        return f"20{m.group(1)}-{m.group(2)}-01"
    m = re.search(r"dev(\d{4})(\d{2})(\d{2})", framework)
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}"


def precision(config: str) -> str:
    text = config
    if re.search(r"^source .*config_common_fp4\.sh", text, re.M) or "FP4=True" in text:
        return "nvfp4"
    return "fp8_tensorwise" if "FP8_RECIPE" in text or "config_common.sh" in text else "fp8"


def rows(git_dir: str):
    commit = git(git_dir, "rev-parse", "HEAD").strip()
    out = []
    for results, config_path, platform, nodes, per_node in SUBMISSIONS:
        config = git(git_dir, "show", f"{commit}:{config_path}")
        mbs = int(re.search(r"^export (?:MICRO_BATCH_SIZE|MBS)=(\d+)", config, re.M).group(1))
        if platform.startswith("mi"):
            prec = "fp8"        # AMD's recipe: FP8_PARAMS=1, TE's hybrid fp8 (delayed scaling)
        else:
            prec = precision(config)
        files = [f for f in git(git_dir, "ls-tree", "--name-only", f"{commit}:{results}").split()
                 if re.fullmatch(r"result_\d+\.txt", f)]
        figures, details = [], []
        for name in sorted(files):
            tput, d = run_throughput(git(git_dir, "show", f"{commit}:{results}/{name}"),
                                     nodes * per_node)
            figures.append(tput)
            details.append(d)
        med = statistics.median(figures)
        gbs, seq = details[0]["gbs"], details[0]["seq"]
        org, system = results.split("/")[0], results.split("/")[2]
        system_json = json.loads(git(git_dir, "show", f"{commit}:{org}/systems/{system}.json"))
        framework = system_json["framework"]
        words = ["MODEL_SIZE=3.1-8B", f"PLATFORM={platform}", f"NNODES={nodes}",
                 f"GPUS_PER_NODE={per_node}", f"BS={gbs}", f"MBS={mbs}", f"SEQ_LENGTH={seq}",
                 f"PRECISION={prec}", "TRANSFORMER_IMPL=transformer_engine"]
        out.append({
            "id": f"mlperf51-llama31-8b-{platform}-{org.lower()}",
            "family": "llama3",
            "source": (f"MLPerf Training v5.1 closed, llama31_8b, {org} {system}: the median over "
                       f"its {len(figures)} result logs of samples x sequence / (run_stop - "
                       f"run_start - evaluations) / GPUs ({REPO_URL}/{commit}/{results}; recipe "
                       f"{REPO_URL}/{commit}/{config_path}; framework '{framework}'); derived by "
                       f"dev/scale/mlperf_rows.py"),
            "software": software_date(framework),
            "setup": (f"{nodes * per_node} {platform.upper()}, GBS {gbs}, MBS {mbs}, seq {seq}, "
                      f"TP1 PP1 CP1, {prec}; {len(figures)} runs, {min(figures):,.0f}-"
                      f"{max(figures):,.0f} tokens/s/GPU"),
            "words": words, "tokens_per_s_per_gpu": round(med, 1)})
    return out


if __name__ == "__main__":
    json.dump({"references": rows(sys.argv[1])}, sys.stdout, indent=1)
