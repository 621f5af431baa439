"""The real point runners: ours through the launcher, the peers as subprocesses.

Each peer runs in its own process (a fresh CUDA context, its own peak-memory figure) and
writes its point as JSON; a side that cannot run on this machine is found out once, before
the loop, by availability() and recorded as 'not runnable: <reason>'.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from training import REPO_ROOT
from training.reading import RecordError, read_json

from .ours import clean_environ, run_logged, run_point
from .sweep import PointSpec


class Runners:
    """Dispatch a point to its side. Work files go under work_dir."""

    def __init__(self, work_dir: Path, family: str = "llama3", master_port: int = 29500,
                 timeout_s: float = 600):
        self.work_dir = Path(work_dir)
        self.family = family
        self.master_port = master_port
        self.timeout_s = timeout_s

    def for_part(self, name: str, family: str | None = None) -> "Runners":
        """The same runner with its files under work_dir/name (one folder per JSON), for the
        part's model family."""
        return Runners(self.work_dir / name, family or self.family, self.master_port,
                       self.timeout_s)

    def __call__(self, spec: PointSpec) -> dict:
        if spec.side == "ours":
            env = dict(spec.env, MASTER_PORT=str(self.master_port + spec.index % 200))
            return run_point(spec.label, env, self.work_dir / "experiment",
                             self.work_dir / "logs", self.family, self.timeout_s)
        if spec.side in ("hf", "hf_liger", "hf_compile", "torchtitan"):
            return self._peer(spec)
        raise ValueError(f"unknown side {spec.side!r}")

    def _peer(self, spec: PointSpec) -> dict:
        shape = spec.shape
        out = self.work_dir / "peers" / f"{spec.label}.json"
        log = self.work_dir / "logs" / f"{spec.label}.log"
        out.parent.mkdir(parents=True, exist_ok=True)
        module = "training.bench.titan_peer" if spec.side == "torchtitan" \
            else "training.bench.hf_peer"
        cmd = [sys.executable, "-m", module, "--model", shape.preset,
               "--num-layers", str(shape.num_layers), "--seq-length", str(shape.seq_length),
               "--mbs", str(shape.mbs), "--global-batch", str(shape.global_batch),
               "--steps", str(shape.steps), "--warmup", str(shape.warmup),
               "--json-out", str(out)]
        if spec.side == "hf_liger":
            cmd.append("--liger")
        if spec.side == "hf_compile":
            cmd.append("--compile")
        env, _ = clean_environ()
        env["PYTHONPATH"] = f"{REPO_ROOT}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO_ROOT)
        if spec.side == "torchtitan":
            env["MASTER_PORT"] = str(self.master_port + spec.index % 200)
        started = time.time()
        returncode, timed_out = run_logged(cmd, env, log, self.timeout_s)
        point = {"side": "peer", "command": cmd[1:], "returncode": returncode,
                 "wall_s": time.time() - started, "log": str(log)}
        if returncode == 0 and out.exists():
            try:
                result = read_json(out, "peer result JSON")
            except RecordError as err:
                result = {"error": str(err)}
            point.update(result if isinstance(result, dict) else
                         {"error": f"{out}: not a peer result (a JSON object)"})
        else:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            point["error"] = (f"timed out after {self.timeout_s:.0f} s\n" if timed_out else "") \
                + tail
        return point


def availability(side: str) -> str | None:
    """None when the side can run here, else why not (checked in a fresh interpreter)."""
    probes = {
        "hf": "import transformers, torch; assert torch.cuda.is_available(), 'no CUDA device'",
        "hf_compile": "import transformers, torch; "
                      "assert torch.cuda.is_available(), 'no CUDA device'",
        "hf_liger": "import transformers, liger_kernel.transformers, torch; "
                    "assert torch.cuda.is_available(), 'no CUDA device'",
        "torchtitan": "from training.bench.titan_peer import probe; probe()",
    }
    if side not in probes:
        return None
    env, _ = clean_environ()
    env["PYTHONPATH"] = f"{REPO_ROOT}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO_ROOT)
    try:
        proc = subprocess.run([sys.executable, "-c", probes[side]], capture_output=True,
                              text=True, timeout=180, env=env, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return "import probe timed out after 180 s"
    if proc.returncode == 0:
        return None
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    return lines[-1] if lines else f"probe exited {proc.returncode}"
