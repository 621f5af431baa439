"""The bash entrypoint as a user runs it: DRY_RUN output and bad input, end to end."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path, *words, script="train_llama3.sh", **env):
    full = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "VERBOSE": "1",
            "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1",
            "PYTHON": sys.executable}
    full.update({k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", str(REPO / "examples" / "llama" / script), *words],
                          env=full, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_dry_run_prints_table_log_dir_and_one_torchrun_line(tmp_path):
    proc = run(tmp_path, GRAD_REDUCE_IN_BF16=0)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    torchrun = [line for line in lines if line.startswith("torchrun ")]
    log_dir = [line for line in lines if line.startswith("LOG_DIR=")]
    assert len(torchrun) == 1 and len(log_dir) == 1
    words = shlex.split(torchrun[0])
    assert words[words.index("--nproc-per-node") + 1] == "1"
    assert "--grad-reduce-in-bf16" not in words and "--cross-entropy-loss-fusion" in words
    for bucket in ("GPT_ARGS:", "TRAIN_ARGS:", "DATA_ARGS:", "OUTPUT_ARGS:", "EXTRA_ARGS:"):
        assert any(line.startswith(bucket) for line in lines), bucket
    # the table: toggle, value, source, flag, bucket
    assert "GRAD_REDUCE_IN_BF16" in proc.stderr and "env" in proc.stderr
    run_dir = Path(log_dir[0].split("=", 1)[1])
    assert run_dir.parts[-2] == "bf16"
    assert run_dir.parts[-3] == "llama3-8B_n1x1_tp1pp1cp1_mbs1gbs128_seq8192"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dry_run"] is True
    row = next(r for r in manifest["toggles"] if r["toggle"] == "GRAD_REDUCE_IN_BF16")
    assert (row["value"], row["source"], row["bucket"]) == ("0", "env", "GPT_ARGS")
    assert manifest["command"][0] == "torchrun"


def test_key_value_words_act_like_env_and_flags_pass_through(tmp_path):
    proc = run(tmp_path, "MODEL_SIZE=tiny", "TP=1", "--log-params-norm", script="train_llama2.sh")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
    assert "--log-params-norm" in shlex.split(line)
    assert "--hidden-size 256" in line


def test_megatron_flags_may_come_first(tmp_path):
    # `train_llama3.sh --exit-duration-in-mins 10`: no KEY=VALUE word before the first --flag
    proc = run(tmp_path, "--exit-duration-in-mins", "10", MODEL_SIZE="tiny")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
    assert shlex.split(line)[-2:] == ["--exit-duration-in-mins", "10"]


def test_local_backend_without_the_softmax_kernel_turns_megatron_fusion_off(tmp_path):
    # the local spec's fused masked softmax imports scaled_masked_softmax_cuda (apex), absent
    # from a pip install: Megatron's fusion is switched off, shown under TRANSFORMER_IMPL
    proc = run(tmp_path, "MODEL_SIZE=tiny", TRANSFORMER_IMPL="local")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
    assert "--no-masked-softmax-fusion" in shlex.split(line)
    proc = run(tmp_path, "MODEL_SIZE=tiny", TRANSFORMER_IMPL="native")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
    assert "--no-masked-softmax-fusion" not in shlex.split(line)


def test_precision_tags_the_run_folder(tmp_path):
    proc = run(tmp_path, PRECISION="mxfp8", PLATFORM="b300")
    assert proc.returncode == 0, proc.stderr
    log_dir = next(x for x in proc.stdout.splitlines() if x.startswith("LOG_DIR="))
    assert Path(log_dir.split("=", 1)[1]).parts[-2] == "mxfp8"


def test_shell_metacharacters_are_quoted_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    name = "a b;touch pwned && echo $(id)"
    proc = run(tmp_path, EXP_NAME=name)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
    run_dir = shlex.split(line)[shlex.split(line).index("--run-dir") + 1]
    assert Path(run_dir).parts[-3] == name


@pytest.mark.parametrize("env,needle", [
    ({"GRAD_REDUCE_IN_BF16": "2"}, "GRAD_REDUCE_IN_BF16='2' is not a toggle value: use 0 or 1"),
    ({"MODEL_SIZE": "9B"}, "MODEL_SIZE='9B' is not a llama3 preset: use one of 8B, 70B, 3.1-8B"),
    ({"PRECISION": "fp16"}, "PRECISION='fp16' is not accepted: use one of bf16, fp8"),
    ({"PLATFORM": "a100"}, "PLATFORM='a100' is not accepted: use one of auto, h100"),
    ({"TP": "two"}, "TP='two' is not an integer"),
    ({"LR": "fast"}, "LR='fast' is not a number"),
    ({"EXP_NAME": "a/b"}, "EXP_NAME='a/b' must be a single folder name"),
    ({"MANUAL_GC_INTERVAL": "-5"}, "MANUAL_GC_INTERVAL=-5 is negative: use 0"),
])
def test_bad_input_exits_2_with_one_message_and_no_traceback(tmp_path, env, needle):
    proc = run(tmp_path, **env)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_bad_words_after_the_script(tmp_path):
    proc = run(tmp_path, "oops")
    assert proc.returncode == 2 and "unexpected word 'oops'" in proc.stderr


def test_lookalike_toggle_warns_and_strict_refuses(tmp_path):
    proc = run(tmp_path, GRAD_REDUCE_IN_BF61="0")
    assert proc.returncode == 0
    assert "GRAD_REDUCE_IN_BF61 is not a toggle; did you mean GRAD_REDUCE_IN_BF16?" in proc.stderr
    strict = run(tmp_path, GRAD_REDUCE_IN_BF61="0", STRICT="1")
    assert strict.returncode == 2 and "GRAD_REDUCE_IN_BF16" in strict.stderr
    assert "Traceback" not in strict.stderr


def test_guard_refusal_exits_2_before_torchrun(tmp_path):
    proc = run(tmp_path, NNODES=2)
    assert proc.returncode == 2
    assert "[multinode_master_addr]" in proc.stderr and "Traceback" not in proc.stderr


def test_without_dry_run_on_a_cpu_machine_nothing_starts(tmp_path):
    proc = run(tmp_path, DRY_RUN=0)
    assert proc.returncode == 2 and "DRY_RUN=1" in proc.stderr
    assert not (tmp_path / "experiment").exists()
