"""The bad-input catalogues' one Case type and runners (tests/test_bad_input_catalogue.py: every
command-line tool; tests/test_bad_input_launcher.py: the launcher and its bash entry points).

A case runs a tool's main(argv) in this process (stdout/stderr captured, the environment
patched, "Exception ignored in ... __del__" reports collected), or a bash entry point as a
subprocess. check_case() fails it on a traceback, an exception that escapes main(), a stray
__del__ report, a second line on stderr, another exit status, or a line that lacks the
expected words.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    id: str
    tool: str  # a module with main(argv), or a path to a bash script (run as a subprocess)
    argv: list[str]
    needle: str  # words the one line must hold
    code: int = 2
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)


def write(rel: str, data: str | bytes) -> Callable[[Path], None]:
    """A setup that writes DATA to tmp/REL (its folders made)."""
    def setup(tmp: Path) -> None:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def fill(text: str, tmp: Path, subs: dict[str, str] | None = None) -> str:
    """{tmp} and each {name} of SUBS replaced in a case's word."""
    text = text.replace("{tmp}", str(tmp))
    for name, value in (subs or {}).items():
        text = text.replace("{" + name + "}", value)
    return text


def in_process(case: Case, argv: list[str], env: dict[str, str], monkeypatch) -> tuple[object, str, str, str]:
    """(exit code, stdout, stderr, what escaped main() or was reported unraisable)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    module = importlib.import_module(case.tool)
    out, err = io.StringIO(), io.StringIO()
    stray: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: stray.append(f"{u.exc_type.__name__}: {u.exc_value} in {u.object!r}")
    escaped = ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = module.main(argv)
            except SystemExit as e:
                code = e.code
            except BaseException:  # noqa: BLE001 - what the catalogue counts
                code, escaped = "exception", traceback.format_exc()
            gc.collect()
    finally:
        sys.unraisablehook = hook
    return code, out.getvalue(), err.getvalue(), escaped + "".join(stray)


def in_bash(case: Case, argv: list[str], env: dict[str, str], tmp: Path) -> tuple[object, str, str, str]:
    full = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "HOME": str(tmp), "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1", **env}
    proc = subprocess.run(["bash", str(REPO / case.tool), *argv], env=full, capture_output=True, text=True,
                          timeout=120, cwd=tmp)
    return proc.returncode, proc.stdout, proc.stderr, ""


def run(case: Case, tmp: Path, monkeypatch, subs: dict[str, str] | None = None) -> tuple[object, str, str, str]:
    """The case's setup, then its tool on its filled words and environment."""
    if case.setup:
        case.setup(tmp)
    argv = [fill(a, tmp, subs) for a in case.argv]
    env = {k: fill(v, tmp, subs) for k, v in case.env.items()}
    if case.tool.endswith(".sh"):
        return in_bash(case, argv, env, tmp)
    return in_process(case, argv, env, monkeypatch)


def check_case(case: Case, tmp: Path, monkeypatch, subs: dict[str, str] | None = None, *,
          quiet_stdout: bool = False) -> None:
    """Run the case and hold it to the bar. quiet_stdout: nothing on stdout either (a launch's
    stdout is what its bash script evals)."""
    code, out, err, escaped = run(case, tmp, monkeypatch, subs)
    assert not escaped and "Traceback" not in out + err, f"TRACEBACK (exit {code}):\n{escaped}{err[-3000:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == case.code, f"exit {code}, expected {case.code}; stderr: {err[-2000:]}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err[-2000:]}"
    assert fill(case.needle, tmp, subs) in lines[0], lines[0]
    if quiet_stdout:
        assert not out.strip(), "nothing for the script to eval after a refusal"
