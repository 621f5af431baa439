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


# ----------------------------------------------------------------------------- issue 38's classes
# tests/test_bad_input_hardening.py runs these: shell injection, secrets, data loss, tracebacks
# where a tool reads a file the project writes, and silent acceptances.

SECRET = "S3CRETPW"        # a secret's value: never on stdout/stderr, in a file or on an argv
MARKER = "PWNED"           # a payload that runs creates this file
PAYLOADS = ("$(touch PWNED)", "`touch PWNED`", "x;touch PWNED", "x\ntouch PWNED", "'; touch PWNED; '",
            'x" ; touch PWNED ; "')
RECORDER = '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$REC/{name}.args"\nenv -0 > "$REC/{name}.env"\n'
SCONTROL = "#!/usr/bin/env bash\necho gpu001\necho gpu002\n"
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[001-002]", "SLURM_JOB_NUM_NODES": "2",
         "SLURM_NODEID": "0", "SLURM_SUBMIT_DIR": str(REPO)}


def fake_tools(tmp: Path, nvidia: bool = True) -> dict[str, str]:
    """docker and srun that record their argv and environment (NUL-separated) into tmp/rec,
    scontrol for a two-node allocation, nvidia-smi: the environment to run a launcher with."""
    bin_, rec = tmp / "bin", tmp / "rec"
    bin_.mkdir(exist_ok=True)
    rec.mkdir(exist_ok=True)
    tools = {"docker": RECORDER.format(name="docker"), "srun": RECORDER.format(name="srun"),
             "scontrol": SCONTROL}
    if nvidia:
        tools["nvidia-smi"] = "#!/usr/bin/env bash\necho 'NVIDIA H200'\n"
    for name, text in tools.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}", "REC": str(rec)}


def recorded(tmp: Path, name: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) a fake tool recorded; ([], {}) when it did not run."""
    args, env = tmp / "rec" / f"{name}.args", tmp / "rec" / f"{name}.env"
    if not args.exists():
        return [], {}
    pairs = [p.split("=", 1) for p in env.read_text().split("\0") if "=" in p]
    return args.read_text().split("\0")[:-1], dict(pairs)


def everything_written(tmp: Path) -> str:
    """The text of every file under tmp (manifests, logs, recorded argv), for a secret search."""
    return "".join(p.read_text(errors="replace") for p in tmp.rglob("*")
                   if p.is_file() and p.stat().st_size < 2_000_000)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def mlperf_log(eval_loss: object = 3.1, stop_after_ms: int = 60_000, status: str = "success") -> str:
    """A small :::MLLOG log: run_start, one evaluation, run_stop."""
    import json

    events = [("run_start", None, {}, 1000), ("submission_benchmark", "llama31_8b", {}, 1000),
              ("eval_accuracy", eval_loss, {"samples_count": 100}, 1000 + stop_after_ms // 2),
              ("run_stop", None, {"status": status, "samples_count": 100}, 1000 + stop_after_ms)]
    return "".join(":::MLLOG " + json.dumps({"key": k, "value": v, "time_ms": t, "metadata": m,
                                             "event_type": "POINT_IN_TIME"}) + "\n"
                   for k, v, m, t in events)
