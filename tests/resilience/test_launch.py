"""The launcher's side of preemption, restarts and hangs: the registry's settings in the
DRY_RUN and their refusals, the supervisor's words and the exec line that runs it, the
workers' flag, and the Slurm script's signal and requeue wiring."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from training.launch.resolve import resolve
from training.launch.guards import Refusals
from training.resilience import exits
from training.resilience.supervise import STOP_SIGNALS

from tests.launchers.conftest import REPO, RECORDER, SLURM_TWO_NODES, subprocess_env, write_tool

SBATCH = REPO / "launchers" / "slurm" / "train.sbatch"


def _resolve(tmp_path, **values):
    env = {"MODEL_SIZE": "tiny", "EXPERIMENT_DIR": str(tmp_path / "exp"), "GPUS_PER_NODE": "1",
           "PREFLIGHT_MEMORY": "off", "DRY_RUN": "1", **{k: str(v) for k, v in values.items()}}
    return resolve("llama3", env)


def test_save_makes_a_stop_signal_a_requeue_shown_with_its_reason(tmp_path):
    launch = _resolve(tmp_path, SAVE=tmp_path / "ckpt", RESTARTS=3, RESTART_BACKOFF=5,
                      HANG_TIMEOUT=300)
    setting = launch.settings.setting("PREEMPTION")
    assert (setting.value, setting.source) == ("requeue", "derived")
    assert "exit 75" in setting.reason
    words = launch.supervisor_args
    assert words == ["--run-dir", str(launch.log_dir), "--preemption", "requeue",
                     "--restarts", "3", "--backoff", "5", "--hang-timeout", "300",
                     "--save", str(tmp_path / "ckpt")]
    output = launch.buckets["OUTPUT_ARGS"]
    assert output[output.index("--hang-timeout") + 1] == "300"
    assert "--exit-signal-handler" in launch.buckets["TRAIN_ARGS"]


def test_without_save_a_stop_signal_stops_and_nothing_is_added(tmp_path):
    launch = _resolve(tmp_path)
    assert launch.settings.setting("PREEMPTION").source == "default"
    assert launch.supervisor_args[:4] == ["--run-dir", str(launch.log_dir), "--preemption",
                                          "stop"]
    assert "--save" not in launch.supervisor_args
    assert "--hang-timeout" not in launch.command


@pytest.mark.parametrize("values, needle", [
    ({"RESTARTS": 2}, "RESTARTS=2 restarts a failed run from the last complete checkpoint in "
                      "SAVE, and SAVE is not set"),
    ({"PREEMPTION": "requeue"}, "PREEMPTION=requeue saves at a stop signal"),
])
def test_restarts_and_requeue_without_save_are_refused(tmp_path, values, needle):
    with pytest.raises(Refusals) as err:
        _resolve(tmp_path, **values)
    assert needle in str(err.value) and "[resilience]" in str(err.value)


def test_a_short_hang_timeout_is_a_warning(tmp_path):
    launch = _resolve(tmp_path, HANG_TIMEOUT=10)
    assert any("HANG_TIMEOUT=10 s" in n.message for n in launch.settings.notices)


def test_the_shell_assignments_carry_the_supervisors_words(tmp_path):
    from training.launch.__main__ import shell_assignments

    text = shell_assignments(_resolve(tmp_path, SAVE=tmp_path / "c", RESTARTS=1))
    line = next(x for x in text.splitlines() if x.startswith("SUPERVISOR_ARGS=("))
    assert "--restarts 1" in line and "--preemption requeue" in line


def test_exec_torchrun_runs_torchrun_under_the_supervisor(tmp_path):
    """A fake PYTHON records what exec_torchrun runs: the supervisor with its words, then `--`
    and the torchrun line."""
    recorded = tmp_path / "python.args"
    fake_python = write_tool(tmp_path, "python", RECORDER.format(name="python", out=recorded))
    script = f"""
set -euo pipefail
PYTHON={sys.executable} source {REPO}/examples/lib/launch.sh
PYTHON={fake_python}
GPT_ARGS=(--gpt) TRAIN_ARGS=() DATA_ARGS=() OUTPUT_ARGS=() EXTRA_ARGS=() USER_ARGS=()
DISTRIBUTED_ARGS=(--nnodes 1) PROFILER_PREFIX=() SUPERVISOR_ARGS=(--run-dir /r --restarts 2)
LOG_FILE={tmp_path / "train.log"} TEE_OUTPUT=0
exec_torchrun
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert recorded.read_text().splitlines() == [
        "-m", "training.resilience.supervise", "--run-dir", "/r", "--restarts", "2", "--",
        "torchrun", "--nnodes", "1", f"{REPO}/training/pretrain_gpt.py", "--gpt"]


def test_the_workers_take_the_hang_timeout_flag():
    from training.arguments import megatron_parser

    args = megatron_parser().parse_args(["--hang-timeout", "120"])
    assert args.hang_timeout == 120
    assert megatron_parser().parse_args([]).hang_timeout == 0


# -- Slurm ------------------------------------------------------------------------------------

def test_the_sbatch_script_asks_for_a_warning_signal_the_supervisor_handles():
    text = SBATCH.read_text()
    match = re.search(r"^#SBATCH --signal=(B:)?([A-Z0-9]+)@(\d+)$", text, re.M)
    assert match, "no #SBATCH --signal line"
    assert getattr(signal, f"SIG{match.group(2)}") in STOP_SIGNALS
    assert int(match.group(3)) >= 60
    assert re.search(r"^#SBATCH --requeue$", text, re.M)
    assert re.search(r"^#SBATCH --open-mode=append$", text, re.M)
    # every #SBATCH line sits before the first command (Slurm stops reading them there)
    first_command = min(i for i, line in enumerate(text.splitlines())
                        if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(text.splitlines())
               if line.startswith("#SBATCH"))


SCONTROL = """#!/usr/bin/env bash
if [ "$1" = requeue ]; then printf '%s\\n' "$@" > "{out}"; exit 0; fi
[ "$1 $2" = "show hostnames" ] && printf 'gpu001\\ngpu002\\n'
"""


@pytest.mark.parametrize("status, requeued", [(exits.PREEMPTED, True), (1, False), (0, False)])
def test_a_preempted_run_requeues_its_job(tmp_path, status, requeued):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_tool(bin_dir, "srun", f"#!/usr/bin/env bash\nexit {status}\n")
    write_tool(bin_dir, "scontrol", SCONTROL.format(out=tmp_path / "requeue.args"))
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "slurm_script").write_text(SBATCH.read_text())
    env = subprocess_env(tmp_path, bin_dir, **SLURM_TWO_NODES)
    proc = subprocess.run(["bash", str(spool / "slurm_script"), "examples/llama/train_llama3.sh"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr
    assert (tmp_path / "requeue.args").exists() == requeued
    if requeued:
        assert (tmp_path / "requeue.args").read_text().split() == ["requeue", "4242"]
        assert "preempted and saved (exit 75): scontrol requeue 4242" in proc.stderr


def test_the_logs_tee_outlives_the_stop_signals_of_the_whole_group(tmp_path):
    """Ctrl-C reaches the terminal's whole process group and Slurm's SIGUSR2 every process of
    the job: the log's tee must not die of them while the run saves and stops."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # the signals come once the run is under way (the tee's trap is set by then)
    write_tool(bin_dir, "torchrun", "#!/usr/bin/env bash\ntrap '' USR2 INT\necho before\n"
                                    "sleep 1\nkill -USR2 0\nkill -INT 0\nsleep 0.3\n"
                                    "echo after\n")
    log = tmp_path / "train.log"
    script = f"""
set -euo pipefail
PYTHON={sys.executable} source {REPO}/examples/lib/launch.sh
PATH={bin_dir}:$PATH
GPT_ARGS=() TRAIN_ARGS=() DATA_ARGS=() OUTPUT_ARGS=() EXTRA_ARGS=() USER_ARGS=()
DISTRIBUTED_ARGS=() PROFILER_PREFIX=() LOG_FILE={log}
exec_torchrun
"""
    proc = subprocess.run(["setsid", "bash", "-c", script], capture_output=True, text=True,
                   timeout=60)
    for _ in range(50):          # tee writes the log from its own process
        if "after" in log.read_text():
            break
        __import__("time").sleep(0.1)
    assert log.read_text().split() == ["before", "after"], proc.stderr
