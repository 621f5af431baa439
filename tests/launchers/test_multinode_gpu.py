"""Multi-node for real on one two-GPU host: two 'nodes' (two torchrun invocations through the
example script, NODE_RANK 0 and 1, one GPU each) train the tiny preset with the same per-iteration
losses as one 2-GPU torchrun of the same config.

Both 'nodes' rendezvous at this host's own non-loopback address: the launcher refuses a loopback
MASTER_ADDR with NNODES > 1 (multinode_master_addr), as it must for real nodes, so the test uses
the address a second machine would use. Run with `make test-gpu` on a machine with 2+ GPUs.
"""
from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "shakespeare"
SCRIPT = REPO / "examples" / "llama" / "train_llama3.sh"
ITERS = 20
TIMEOUT = 900


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _non_loopback(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local)


def host_address() -> str | None:
    """An IPv4 address of this host that is not loopback, or None."""
    candidates = []
    try:
        candidates += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                                 socket.AF_INET)]
    except OSError:
        pass
    try:  # the source address of the default route (a UDP connect sends nothing)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))
            candidates.append(sock.getsockname()[0])
    except OSError:
        pass
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10)
        candidates += out.stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    return next((a for a in candidates if _non_loopback(a) and ":" not in a), None)


def _env(tmp_path: Path, name: str, **toggles) -> dict[str, str]:
    env = dict(os.environ, MODEL_SIZE="tiny", EXP_NAME=name, RUN_ID="run",
               EXPERIMENT_DIR=str(tmp_path / "experiment"), TOTAL_ITERS=str(ITERS),
               EVAL_ITERS="0", LR="1e-3", MIN_LR="1e-4", SEED="1234")
    if (SAMPLE / "train.bin").exists():
        env["DATA_PATH"] = str(SAMPLE / "train")
    for key in ("DRY_RUN", "PLATFORM", "NODE_RANK", "NNODES", "GPUS_PER_NODE"):
        env.pop(key, None)
    env.update({k: str(v) for k, v in toggles.items()})
    return env


def _run_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / "experiment" / name / "bf16" / "run"


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["iteration"]: r["loss"] for r in rows if r.get("loss") is not None}


def _wait(procs: list[subprocess.Popen], what: str) -> None:
    try:
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{what}: timed out after {TIMEOUT}s")
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"{what} failed (exit {p.returncode}):\n{out[-3000:]}\n{err[-3000:]}"


def test_two_single_gpu_nodes_match_one_two_gpu_node(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs on this host")
    addr = host_address()
    if addr is None:
        pytest.skip("this host has no non-loopback address for the rendezvous "
                    "(the launcher refuses loopback with NNODES=2)")

    port = _free_port()
    nodes = [subprocess.Popen(
        ["bash", str(SCRIPT)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path, "two-nodes", NNODES=2, NODE_RANK=rank, GPUS_PER_NODE=1,
                 MASTER_ADDR=addr, MASTER_PORT=port, CUDA_VISIBLE_DEVICES=rank))
        for rank in (1, 0)]
    _wait(nodes, "two nodes")
    check_matches_one_two_gpu_node(tmp_path, "two-nodes")


def check_matches_one_two_gpu_node(tmp_path: Path, two_nodes: str) -> None:
    """One 2-GPU torchrun of the same config; its losses against the two nodes' run."""
    one = subprocess.Popen(
        ["bash", str(SCRIPT)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path, "one-node", GPUS_PER_NODE=2, MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=_free_port(), CUDA_VISIBLE_DEVICES="0,1"))
    _wait([one], "one node")

    two_run, one_run = _run_dir(tmp_path, two_nodes), _run_dir(tmp_path, "one-node")
    assert (two_run / "train.node0.log").exists() and (two_run / "train.node1.log").exists()
    assert (one_run / "train.log").exists()
    layout = json.loads((two_run / "manifest.json").read_text())["layout"]
    assert (layout["nnodes"], layout["gpus_per_node"], layout["world_size"]) == (2, 1, 2)

    a, b = _losses(two_run), _losses(one_run)
    assert sorted(a) == sorted(b) == list(range(1, ITERS + 1)), (sorted(a), sorted(b))
    rel = {i: abs(a[i] - b[i]) / abs(b[i]) for i in b}
    worst = max(rel, key=rel.get)
    print(f"\nworst relative loss difference: {rel[worst]:.2e} at iteration {worst} "
          f"(two nodes {a[worst]:.6f}, one node {b[worst]:.6f}; data: "
          f"{'shakespeare' if (SAMPLE / 'train.bin').exists() else 'mock'})")
    assert rel[worst] <= 1e-3


def test_two_slurm_nodes_through_sbatch_match_one_two_gpu_node(tmp_path):
    """The same through the Slurm path (issue 27): launchers/slurm/train.sbatch -> srun -> node.sh
    on each of two 'nodes' of this host (a fake srun and scontrol: tests/launchers/conftest.py),
    NODE_RANK, NNODES and MASTER_ADDR derived from the allocation by training.deploy.cluster."""
    import torch

    from .conftest import one_host_slurm

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs on this host")
    addr = host_address()
    if addr is None:
        pytest.skip("this host has no non-loopback address for the rendezvous")
    slurm, logs = one_host_slurm(tmp_path, addr)
    env = _env(tmp_path, "slurm-nodes", GPUS_PER_NODE=1, MASTER_PORT=_free_port())
    env.update({k: v for k, v in slurm.items() if k.startswith(("SLURM_", "ONE_HOST_"))},
               PATH=slurm["PATH"])
    env.pop("MASTER_ADDR", None)
    copy = tmp_path / "spool" / "slurm_script"   # sbatch runs a copy from its spool folder
    copy.parent.mkdir()
    copy.write_text((REPO / "launchers" / "slurm" / "train.sbatch").read_text())
    sbatch = subprocess.Popen(["bash", str(copy), str(SCRIPT)], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        _wait([sbatch], "two Slurm nodes")
    finally:
        for rank in (0, 1):
            out = logs / f"node{rank}.out"
            if out.exists():
                print(f"== node {rank}\n" + "\n".join(out.read_text().splitlines()[-15:]))
    check_matches_one_two_gpu_node(tmp_path, "slurm-nodes")
