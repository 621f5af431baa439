"""The launch's default output: one screen (80x40) that says what matters, the torchrun line
last, wrapped for reading and still one shell command; VERBOSE=1 and the run folder's
launch.txt keep the full table."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dry_run(tmp_path, *words, **env) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable,
            "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1", "COLUMNS": "80"}
    full.update(env)
    return subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh"), *words],
                          env=full, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def _block(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("torchrun "))
    return lines[start:]


def _words_of(stdout: str) -> list[str]:
    """What bash runs from the printed LOG_DIR line and torchrun block (torchrun -> printf)."""
    lines = stdout.splitlines()
    log_dir = next(line for line in lines if line.startswith("LOG_DIR="))
    script = log_dir + "\nprintf '%s\\n' " + "\n".join(_block(stdout))[len("torchrun "):]
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return ["torchrun", *out.stdout.splitlines()]


def test_the_default_launch_fits_one_screen_with_the_torchrun_line_last(tmp_path):
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines() + proc.stdout.splitlines()
    # a line wider than the screen is one word (a path): never a word broken by our wrapping
    rows = sum(1 if len(line) <= 80 else -(-len(line) // 80) for line in lines)
    assert rows <= 45, "\n".join(lines)
    for line in lines:
        assert len(line) <= 80 or " " not in line.split("=", 1)[-1].strip(" \\"), line
    block = _block(proc.stdout)
    assert lines[-len(block):] == block and block[-1].strip() == "--distributed-backend nccl"
    assert all(line.endswith(" \\") for line in block[:-1])
    # the same command as the one-line form VERBOSE=1 prints
    verbose = dry_run(tmp_path, VERBOSE="1", RUN_ID="same")
    once = next(x for x in verbose.stdout.splitlines() if x.startswith("torchrun "))
    assert _words_of(dry_run(tmp_path, RUN_ID="same2").stdout)[:40] == shlex.split(once)[:40]
    # the summary: the run in one line, no fork advice for someone who never used the fork
    assert proc.stderr.startswith("llama3-8B bf16 ")
    assert "fork_defaults" not in proc.stderr and "ROCm fork" not in proc.stderr


def test_the_wrapped_line_runs_what_the_one_line_form_runs(tmp_path):
    words = _words_of(dry_run(tmp_path, "TP=1", RUN_ID="r1").stdout)
    one = dry_run(tmp_path, "TP=1", VERBOSE="1", RUN_ID="r2").stdout
    line = shlex.split(next(x for x in one.splitlines() if x.startswith("torchrun ")))
    assert [w.replace("/r1", "/r2") for w in words] == line


def test_every_setting_of_the_users_is_shown_with_its_source(tmp_path):
    proc = dry_run(tmp_path, "SEED=7", "--log-params-norm", LR="1e-3", TOTAL_ITERS="40",
                   NCCL_DEBUG="INFO", GRAD_REDUCE_IN_BF16="0")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stderr.split())
    for shown in ("SEED=7", "LR=0.001", "TOTAL_ITERS=40", "GRAD_REDUCE_IN_BF16=0",
                  "--log-params-norm"):
        assert shown in text, shown
    assert "env:" in text and "cli:" in text


def test_verbose_prints_the_table_and_the_run_folder_always_has_it(tmp_path):
    quiet = dry_run(tmp_path, RUN_ID="a")
    assert "┃ toggle" not in quiet.stderr and "GPT_ARGS:" not in quiet.stdout
    log_dir = Path(next(x for x in quiet.stdout.splitlines() if x.startswith("LOG_DIR="))[8:])
    table = (log_dir / "launch.txt").read_text()
    assert "┃ toggle" in table and "│ GRAD_REDUCE_IN_BF16 " in table
    loud = dry_run(tmp_path, RUN_ID="b", VERBOSE="1")
    assert "┃ toggle" in loud.stderr and "GPT_ARGS:" in loud.stdout


def test_the_forks_defaults_line_comes_with_a_variable_of_the_forks(tmp_path):
    proc = dry_run(tmp_path, TE_FP8="0")
    assert "[fork_defaults] the ROCm fork's train_llama3.sh would run" in proc.stderr
