"""The torchrun line every example script ends with is written once, in examples/lib/launch.sh."""
from __future__ import annotations

import subprocess
import time

from .conftest import REPO, RECORDER, write_tool

SCRIPTS = ("examples/llama/train_llama3.sh", "examples/llama/train_llama2.sh",
           "examples/mlperf/llama31_8b/run_llama31_8b.sh")


def test_every_example_script_ends_with_the_shared_exec_line():
    for script in SCRIPTS:
        text = (REPO / script).read_text()
        assert "\nexec_torchrun" in text, script
        assert "torchrun \"${DISTRIBUTED_ARGS[@]}\"" not in text, script


def test_exec_torchrun_runs_the_buckets_in_order_and_tees_the_log(tmp_path):
    """A fake torchrun records its arguments; the buckets arrive in Megatron-LM's order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args_file = tmp_path / "torchrun.args"
    write_tool(bin_dir, "torchrun", RECORDER.format(name="torchrun", out=args_file)
               + "echo started\n")
    log = tmp_path / "train.log"
    script = f"""
set -euo pipefail
PYTHON=python3 source {REPO}/examples/lib/launch.sh
PATH={bin_dir}:$PATH
GPT_ARGS=(--gpt 'a b') TRAIN_ARGS=(--train) DATA_ARGS=(--data) OUTPUT_ARGS=(--output)
EXTRA_ARGS=(--extra) USER_ARGS=(--user) DISTRIBUTED_ARGS=(--nnodes 1) PROFILER_PREFIX=()
LOG_FILE={log}
exec_torchrun
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert args_file.read_text().splitlines() == [
        "--nnodes", "1", f"{REPO}/training/pretrain_gpt.py", "--gpt", "a b", "--train", "--data",
        "--output", "--extra", "--user"]
    for _ in range(50):          # tee writes the log from its own process
        if "started" in log.read_text():
            break
        time.sleep(0.1)
    assert "started" in log.read_text()


def test_tee_output_0_writes_the_log_only(tmp_path):
    """The ROCm fork's TEE_OUTPUT=0: the run's output goes to the log file, not the console."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_tool(bin_dir, "torchrun", "#!/usr/bin/env bash\necho started\necho oops >&2\n")
    log = tmp_path / "train.log"
    script = f"""
set -euo pipefail
PYTHON=python3 source {REPO}/examples/lib/launch.sh
PATH={bin_dir}:$PATH
GPT_ARGS=() TRAIN_ARGS=() DATA_ARGS=() OUTPUT_ARGS=() EXTRA_ARGS=() USER_ARGS=()
DISTRIBUTED_ARGS=() PROFILER_PREFIX=() LOG_FILE={log} TEE_OUTPUT=0
exec_torchrun
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert log.read_text().split() == ["started", "oops"]
