"""training/quiet.py: known third-party noise off the console into a log, with a count; every
other warning and line still shown."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from training import quiet

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import logging, sys, warnings
    from pathlib import Path
    from training import quiet

    q = quiet.install("child", log=Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    warnings.warn("Apex is not installed. Falling back to Torch Norm")       # known
    warnings.warn("your learning rate is out of range", UserWarning)         # not known
    print("WARNING: one_logger package is required to enable e2e metrics tracking. ...")
    print("iteration 1: loss 10.2")
    logging.warning("GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes")
    print("a line of our own", file=sys.stderr)
""")


def _child(*args: str, quiet_env: str = "1") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), QUIET=quiet_env)
    return subprocess.run([sys.executable, "-c", CHILD, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_known_noise_goes_to_the_log_and_the_rest_is_shown(tmp_path):
    log = tmp_path / "run" / quiet.LOG_NAME
    proc = _child(str(log))
    assert proc.returncode == 0, proc.stderr
    console = "".join(line for line in (proc.stdout + proc.stderr).splitlines(True)
                      if not line.startswith("[quiet] "))
    assert "your learning rate is out of range" in console      # every other warning shown
    assert "iteration 1: loss 10.2" in proc.stdout
    assert "a line of our own" in proc.stderr
    for noise in ("Apex is not installed", "one_logger", "GPTModel IS DEPRECATED"):
        assert noise not in console, noise
        assert noise in log.read_text()
    (count,) = [line for line in proc.stderr.splitlines() if line.startswith("[quiet] ")]
    assert count.startswith("[quiet] 3 known third-party warning line(s) at start")
    assert str(log) in count and "Apex/TE fallback x1" in count
    # the warning's source line went with it, not to the console
    assert "warnings.warn(" not in console


def test_quiet_0_prints_everything():
    proc = _child(quiet_env="0")
    assert "Apex is not installed" in proc.stderr and "[quiet]" not in proc.stderr


def test_a_tool_without_a_run_folder_keeps_its_lines_in_a_file_it_names():
    proc = _child()
    (count,) = [line for line in proc.stderr.splitlines() if line.startswith("[quiet] ")]
    path = Path(count.split(" went to ")[1].split(";")[0])
    try:
        assert "Apex is not installed" in path.read_text()
    finally:
        path.unlink()


def test_the_table_matches_what_it_names_and_nothing_of_ours():
    assert quiet.match("UserWarning: Transformer Engine and Apex are not installed. Falling "
                       "back to Torch optimizers.").name == "Apex/TE fallback"
    assert quiet.match("RuntimeWarning: Detected a Jax installation but could not find the "
                       "shared object file for the Transformer Engine Jax extension library")
    assert quiet.match("SyntaxWarning: invalid escape sequence '\\-'")
    for ours in ("WARNING [preflight_memory] the estimated peak memory ...",
                 "error: [tp_divides] TP=3 does not divide 8 GPUs",
                 "UserWarning: your learning rate is out of range",
                 "[summary] tokens/s/GPU 33,000"):
        assert quiet.match(ours) is None, ours
