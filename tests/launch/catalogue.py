"""A catalogue of launches and their DRY_RUN output, to prove a refactor changes nothing.

`python -m tests.launch.catalogue --write` records, for every launch below, what the launcher
prints (the table and notices on stderr, the shell assignments with the buckets and the
torchrun line on stdout, or the error and exit code) into catalogue.json beside this file;
tests/launch/test_catalogue.py runs the same launches and compares.

All launches run in one child process (imports are paid once). Their common environment is
clean (no variable of the calling shell reaches them), under a fresh folder whose path has a
fixed length (/tmp/lc-XXXXXXXX), so the table's layout does not depend on where it ran:
that folder, the repository path and launch timestamps are replaced by placeholders of the
same length. COLUMNS is wide so that no table cell is folded; VERBOSE=1 records the full
table (the default one-screen summary is tested in tests/launch/test_summary.py).

Launches with PLATFORM=auto depend on what this machine has (GPUs, Transformer Engine,
Liger): the file records the capabilities they were recorded with, and the test skips them
where the machine differs.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURE = HERE / "catalogue.json"
SEED_TOKEN = "<DRAWN-SEED>"
# MLPerf launches plan a page-cache drop; a hook makes the plan the same on every machine (as
# root or not); DRY_RUN never runs it.
CACHE_HOOK = "sudo -n /usr/local/sbin/drop_caches"
ROOT_TOKEN = "<CATALOGUE-ROOT>"       # as long as /tmp/lc-XXXXXXXX
TIME_TOKEN = "YYYYMMDD-HHMMSS"
COLUMNS = "1000"

# (id, entry, environment, words). entry: a family of training.launch, or "mlperf".
# {root}, {data}, {valid}, {large_valid}, {tokenizer} are filled in at run time.
LAUNCHES: list[tuple[str, str, dict[str, str], list[str]]] = [
    # -- defaults and words ---------------------------------------------------------------------
    ("default", "llama3", {}, []),
    ("perf_off_as_word", "llama3", {}, ["GRAD_REDUCE_IN_BF16=0", "DDP_AVERAGE_IN_COLLECTIVE=0"]),
    ("h200_te", "llama3", {"PLATFORM": "h200", "RUN_ID": "r1"}, []),
    ("llama2_13b_mi300x_tp2", "llama2",
     {"PLATFORM": "mi300x", "GPUS_PER_NODE": "2", "TP": "2", "RUN_ID": "r1"}, ["MODEL_SIZE=13B"]),
    ("llama2_70b_mi355x_fp8_tp8", "llama2",
     {"PLATFORM": "mi355x", "GPUS_PER_NODE": "8", "TP": "8", "PRECISION": "fp8",
      "MODEL_SIZE": "70B", "BS": "64", "RUN_ID": "r1"}, []),
    ("layers_seq_deterministic_torch_kernels", "llama3",
     {"NUM_LAYERS": "8", "SEQ_LENGTH": "4096", "DETERMINISTIC": "1", "NATIVE_KERNELS": "torch",
      "RUN_ID": "r1"}, []),
    # -- precision -------------------------------------------------------------------------------
    ("h200_fp8", "llama3", {"PLATFORM": "h200", "PRECISION": "fp8", "RUN_ID": "r1"}, []),
    ("b300_mxfp8", "llama3", {"PLATFORM": "b300", "PRECISION": "mxfp8", "RUN_ID": "r1"}, []),
    ("b300_nvfp4_layers", "llama3",
     {"PLATFORM": "b300", "PRECISION": "nvfp4", "FP4_BF16_LAYERS_END": "2", "RUN_ID": "r1"}, []),
    ("te_fp8_tensorwise_spelling", "llama3",
     {"PLATFORM": "h200", "TE_FP8": "1", "TE_FP8_RECIPE": "tensorwise", "RUN_ID": "r1"}, []),
    ("mi355x_mxfp4_on_the_fork", "llama3",
     {"PLATFORM": "mi355x", "PRECISION": "mxfp4", "GRAD_REDUCE_IN_BF16": "0"}, []),
    ("refused_h200_mxfp4_stock_megatron", "llama3", {"PLATFORM": "h200", "PRECISION": "mxfp4"},
     []),
    ("h200_fp8_blockwise", "llama3",
     {"PLATFORM": "h200", "PRECISION": "fp8_blockwise", "RUN_ID": "r1"}, []),
    ("refused_h100_mxfp8", "llama3", {"PLATFORM": "h100", "PRECISION": "mxfp8"}, []),
    ("refused_fp8_on_cpu", "llama3", {"PRECISION": "fp8", "FP4_SELECTIVE_BF16": "1"}, []),
    ("refused_fp8_and_fp4", "llama3", {"PLATFORM": "b300", "TE_FP8": "1", "TE_FP4": "1"}, []),
    ("refused_spelling_conflict", "llama3",
     {"PLATFORM": "h200", "PRECISION": "bf16", "TE_FP8": "1"}, []),
    ("bad_recipe_without_switch", "llama3", {"TE_FP8_RECIPE": "mxfp8"}, []),
    ("refused_mxfp8_hybrid", "llama3",
     {"PLATFORM": "b300", "PRECISION": "mxfp8", "FP8_FORMAT": "hybrid"}, []),
    # -- parallel layout, recompute, backends ------------------------------------------------------
    ("h200x8_tp2_pp2_cp2", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "TP": "2", "PP": "2", "CP": "2", "BS": "64",
      "RUN_ID": "r1"}, []),
    ("refused_tp3", "llama3", {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "TP": "3"}, []),
    ("selective_recompute_mbs2", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "RECOMPUTE": "selective", "MBS": "2",
      "RUN_ID": "r1"}, []),
    ("local_full_recompute_tiny", "llama3",
     {"TRANSFORMER_IMPL": "local", "RECOMPUTE": "full", "RUN_ID": "r1"}, ["MODEL_SIZE=tiny"]),
    ("refused_local_sequence_parallel", "llama3",
     {"TRANSFORMER_IMPL": "local", "SEQUENCE_PARALLEL": "1", "TP": "2", "GPUS_PER_NODE": "2",
      "MODEL_SIZE": "tiny"}, []),
    ("sequence_parallel_at_tp1_corrected", "llama3",
     {"SEQUENCE_PARALLEL": "1", "MODEL_SIZE": "tiny", "RUN_ID": "r1"}, []),
    ("fsdp_h200x8", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "FSDP": "1", "RUN_ID": "r1"}, []),
    ("refused_fsdp_explicit_fusion_and_env", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "FSDP": "1",
      "GRADIENT_ACCUMULATION_FUSION": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}, []),
    ("refused_fsdp_env_only", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "FSDP": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
     []),
    ("refused_ce_chunk_at_tp2", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "2", "TP": "2", "CE_CHUNK_MEM": "4",
      "TRANSFORMER_IMPL": "native"}, []),
    ("ce_fusion_off_overlap_off", "llama3",
     {"CROSS_ENTROPY_LOSS_FUSION": "0", "DISTRIBUTED_OPTIMIZER": "0", "RUN_ID": "r1"}, []),
    # -- training loop, profile, run folder ----------------------------------------------------------
    ("manual_gc_nan_bucket", "llama3",
     {"MANUAL_GC_INTERVAL": "10", "NAN_CHECK": "bucket", "RUN_ID": "r1"}, []),
    ("bad_manual_gc", "llama3", {"MANUAL_GC_INTERVAL": "-5"}, []),
    ("profile_torch_two_ranks", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "2", "PROFILE": "torch", "PROFILE_RANKS": "0,1",
      "RUN_ID": "r1"}, []),
    ("profile_nsys", "llama3", {"PLATFORM": "h200", "PROFILE": "nsys", "RUN_ID": "r1"}, []),
    ("refused_profile_window", "llama3", {"PROFILE": "torch", "PROFILE_STEP_END": "50"}, []),
    ("schedule_lr_extra_args", "llama3",
     {"LR": "1e-3", "WARMUP_ITERS": "5", "TOTAL_ITERS": "40", "EXP_NAME": "mine",
      "EXTRA_MEGATRON_ARGS": "--exit-duration-in-mins 25", "LOAD": "{root}/ckpt", "RESUME": "auto",
      "SAVE": "{root}/ckpt", "SAVE_INTERVAL": "10", "RUN_ID": "r1"},
     ["SEED=7", "--log-params-norm"]),
    ("save_without_interval", "llama3", {"SAVE": "{root}/ckpt", "RUN_ID": "r1"}, []),
    ("refused_several_at_once", "llama3",
     {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "TP": "3", "WARMUP_ITERS": "30",
      "NNODES": "2", "MIN_LR": "1"}, []),
    ("bad_exp_name", "llama3", {"EXP_NAME": "a/b"}, []),
    ("bad_word", "llama3", {}, ["oops"]),
    ("bad_toggle_value", "llama3", {"TP": "two"}, []),
    ("multinode_passthrough_lookalike", "llama3",
     {"PLATFORM": "h200", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "node0",
      "RUN_ID": "job7", "NCCL_DEBUG": "INFO", "GRAD_REDUCE_IN_BF61": "0"}, ["FOO=bar"]),
    # -- data ------------------------------------------------------------------------------------------
    ("data_split_derived_tokenizer", "llama3",
     {"DATA_PATH": "{data}", "SPLIT": "90,10,0", "MODEL_SIZE": "tiny", "RUN_ID": "r1"}, []),
    ("data_blend_and_valid", "llama3",
     {"DATA_PATH": "0.7 {data} 0.3 {large_valid}", "VALID_DATA_PATH": "{valid}",
      "TOKENIZER_MODEL": "{tokenizer}", "MODEL_SIZE": "tiny", "SPLIT": "99,1,0",
      "RUN_ID": "r1"}, []),
    ("refused_data_twice", "llama3",
     {"DATA_PATH": "0.7 {data} 0.3 {data}", "TOKENIZER_MODEL": "{tokenizer}",
      "MODEL_SIZE": "tiny", "RUN_ID": "r1"}, []),
    ("refused_valid_is_training_data", "llama3",
     {"DATA_PATH": "{data}", "VALID_DATA_PATH": "{data}", "TOKENIZER_MODEL": "{tokenizer}",
      "MODEL_SIZE": "tiny", "RUN_ID": "r1"}, []),
    ("refused_missing_data", "llama3", {"DATA_PATH": "{root}/nothing", "MODEL_SIZE": "tiny"}, []),
    # -- MLPerf (examples/mlperf/llama31_8b/run_llama31_8b.sh -> training.mlperf.launch) ----------------
    ("mlperf_open_tiny", "mlperf",
     {"MLPERF_DIVISION": "open", "MODEL_SIZE": "tiny", "SEQ_LENGTH": "128",
      "MLPERF_EVAL_SAMPLES": "16", "BS": "8", "DATA_PATH": "{data}", "VALID_DATA_PATH": "{valid}",
      "TOKENIZER_MODEL": "{tokenizer}", "RUN_ID": "r1", "MLPERF_CACHE_CLEAR_CMD": CACHE_HOOK}, []),
    ("refused_mlperf_variables_on_llama3", "llama3", {"MLPERF_DIVISION": "open"},
     ["MLPERF_TARGET_LOSS=3.3"]),
    ("mlperf_closed_mock_refused", "mlperf", {"MLPERF_CACHE_CLEAR_CMD": CACHE_HOOK}, []),
    ("mlperf_closed_free_choices", "mlperf",
     {"BS": "64", "LR": "1e-3", "GPUS_PER_NODE": "8", "PLATFORM": "h200",
      "DATA_PATH": "{data}", "VALID_DATA_PATH": "{large_valid}", "TOKENIZER_MODEL": "{tokenizer}",
      "RUN_ID": "r1", "MLPERF_CACHE_CLEAR_CMD": CACHE_HOOK}, []),
    ("mlperf_closed_rule_flag_refused", "mlperf",
     {"DATA_PATH": "{data}", "VALID_DATA_PATH": "{large_valid}", "TOKENIZER_MODEL": "{tokenizer}",
      "MLPERF_CACHE_CLEAR_CMD": CACHE_HOOK},
     ["--hidden-dropout", "0.1"]),
    ("mlperf_closed_broken_rule_refused", "mlperf",
     {"DATA_PATH": "{data}", "VALID_DATA_PATH": "{large_valid}", "TOKENIZER_MODEL": "{tokenizer}",
      "MLPERF_CACHE_CLEAR_CMD": CACHE_HOOK},
     ["ADAM_EPS=1e-8", "EVAL_ITERS=3"]),
]


class _Sink(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr: writes go to the current launch's buffer."""

    def __init__(self):
        self.buffer_ = io.StringIO()

    def write(self, text):
        return self.buffer_.write(text)

    def isatty(self):
        return False

    def take(self) -> str:
        text, self.buffer_ = self.buffer_.getvalue(), io.StringIO()
        return text


def _fill(text: str, places: dict[str, str]) -> str:
    for key, value in places.items():
        text = text.replace("{" + key + "}", value)
    return text


def _normalise(text: str, root: str) -> str:
    """Placeholders for the folder, the repository and timestamps; the table's padding and
    rules shrunk to one character (its layout is rich's; its content is ours)."""
    # the wrapped torchrun line is LAUNCH_LINE's words again (tests/launch/test_summary.py
    # checks it); where it breaks depends on a drawn seed's digits
    text = re.sub(r"LAUNCH_LINE_WRAPPED=.*?\nVERBOSE=", "VERBOSE=", text, flags=re.S)
    text = text.replace(root, ROOT_TOKEN).replace(str(REPO), "<REPO>")
    text = re.sub(r"\b\d{8}-\d{6}\b", TIME_TOKEN, text)
    text = re.sub(r"([─━])\1+", r"\1", re.sub(r" {2,}", " ", text))
    return "\n".join(line.rstrip() for line in text.split("\n"))


def _drawn_seed(text: str) -> str:
    """An MLPerf launch's seed, drawn per launch, as a placeholder (the table row, the flag)."""
    text = re.sub(r"(--seed )\d+", r"\1" + SEED_TOKEN, text)
    return re.sub(r"(│ SEED +│ )\d+", r"\1" + SEED_TOKEN, text)


def _datasets(root: Path) -> dict[str, str]:
    sys.path.insert(0, str(REPO))
    from tests.mlperf.datasets import make_datasets, make_large_valid

    data = make_datasets(root / "data")
    return {"data": data["DATA_PATH"], "valid": data["VALID_DATA_PATH"],
            "tokenizer": data["TOKENIZER_MODEL"],
            "large_valid": make_large_valid(root / "data", data["TOKENIZER_MODEL"])}


def run_catalogue(only: list[str] | None = None) -> dict:
    """Every launch's normalised output (run in a process of its own: it rewrites os.environ
    and sys.stdout/sys.stderr before importing the launcher)."""
    out_sink, err_sink = _Sink(), _Sink()
    real_out = sys.stdout
    root = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    assert len(str(root)) == len(ROOT_TOKEN), root
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(root), "COLUMNS": COLUMNS,
            "VERBOSE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    try:
        os.environ.clear()
        os.environ.update(base)
        places = {"root": str(root), **_datasets(root)}
        sys.stdout, sys.stderr = out_sink, err_sink
        from training.launch import capabilities
        from training.launch.__main__ import main as launch_main
        from training.mlperf.launch import main as mlperf_main

        results = {}
        for name, entry, env, words in LAUNCHES:
            if only and name not in only:
                continue
            os.environ.clear()
            os.environ.update(base, EXPERIMENT_DIR=str(root / "experiment"), DRY_RUN="1")
            os.environ.update({k: _fill(v, places) for k, v in env.items()})
            argv = [_fill(w, places) for w in words]
            try:
                rc = (mlperf_main(argv) if entry == "mlperf"
                      else launch_main(["--family", entry, *argv]))
            except SystemExit as stop:
                rc = stop.code
            out_text, err_text = out_sink.take(), err_sink.take()
            if entry == "mlperf":   # each MLPerf launch draws its own seed
                out_text, err_text = _drawn_seed(out_text), _drawn_seed(err_text)
            results[name] = {"entry": entry, "rc": rc,
                             "auto": env.get("PLATFORM", "auto") == "auto",
                             "stdout": _normalise(out_text, str(root)),
                             "stderr": _normalise(err_text, str(root))}
        detected = capabilities.detect().to_dict()
    finally:
        sys.stdout, sys.stderr = real_out, sys.__stderr__
        shutil.rmtree(root, ignore_errors=True)
    return {"detected": detected, "launches": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.launch.catalogue")
    parser.add_argument("--write", action="store_true", help=f"record into {FIXTURE.name}")
    parser.add_argument("--only", nargs="*", help="these launches only")
    args = parser.parse_args(argv)
    result = run_catalogue(args.only)
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.write:
        FIXTURE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
