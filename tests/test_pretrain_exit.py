"""pretrain_gpt ends a worker whose run raised, even when something keeps the interpreter
alive (the local-backend hang of 2026-11-30: a traceback, then no exit)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(statement: str, blocking_thread: bool) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys, threading
        sys.path.insert(0, {str(REPO)!r})
        from training.pretrain_gpt import exit_on_error
        if {blocking_thread}:  # a non-daemon thread that never ends holds a plain exit
            threading.Thread(target=threading.Event().wait).start()
        def run():
            {statement}
        exit_on_error(run)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_an_exception_ends_the_process_with_its_traceback():
    proc = _run("raise ModuleNotFoundError(\"No module named 'scaled_masked_softmax_cuda'\")",
                blocking_thread=True)
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'scaled_masked_softmax_cuda'" in proc.stderr


def test_system_exit_keeps_its_code_and_the_normal_shutdown():
    proc = _run("sys.exit(3)", blocking_thread=False)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
