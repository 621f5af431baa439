"""The tiny preset trains for real through the launcher on a GPU: the recorded loss curve per
backend, the backends against each other, and checkpoint save/resume continuing the same curve."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "shakespeare"
TIMEOUT_S = 150  # a tiny run takes under a minute on an H200 (43 s for native, 2026-11-30)
BACKENDS = ["native", "local"] + (["transformer_engine"]
                                  if importlib.util.find_spec("transformer_engine") else [])

# The tiny run's mean loss over iterations 26-30 (30 iterations, LR 1e-3 -> 1e-4, the shipped
# corpus), as recorded on H200s: 6.197 to 6.199 in seven runs over three sessions, both backends
# (dev/gpu_logs/2026-11-30_*.log: native 6.199 x4, 6.198, 6.197; local 6.197 x2), from 8.670
# over iterations 1-5. A deliberate change of what the tiny run trains (recipe, data, init)
# moves it: record the new value from the GPU log, with the log. By backend: a backend without
# a recorded run (transformer_engine: TE's layers draw and hold their weights their own way)
# is not pinned to another's record; record its value from its first GPU log, then add it here.
# transformer_engine: 6.197 in its first run (TE 2.20.2, every default-on toggle, GA fusion
# included; dev/gpu_logs/2026-12-01_s7_h200_untimed_burst.log), native 6.198 and local 6.197
# in the same session.
RECORDED_LATE_LOSS = {"native": 6.198, "local": 6.198, "transformer_engine": 6.197}
# 0.05: 25x the recorded spread (0.002), 2% of the 2.47 the run learns.
LATE_LOSS_TOL = 0.05
# Backends against each other, in the same call: recorded 0.002 apart (6.199 native, 6.197
# local, 2026-11-30_s3_h200x2_train_tests.log); 0.02 is 10x that. Recorded backends only.
BACKEND_TOL = 0.02
# An unrecorded backend must learn: 1.0 of the recorded 2.47 fall over iterations 1-5 to 26-30
# (the bound the recorded curve replaced: it fails a run that does not learn, not a subtle slip).
UNRECORDED_MIN_FALL = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SCRIPT = "examples/llama/train_llama3.sh"


def _train(tmp_path: Path, name: str, *words: str, script: str = SCRIPT,
           timeout_s: float = TIMEOUT_S, **toggles) -> Path:
    if not (SAMPLE / "train.bin").exists():
        pytest.skip("the shipped corpus is not built: run `make data-sample` first")
    env = dict(os.environ, MODEL_SIZE="tiny", GPUS_PER_NODE="1", EXP_NAME=name, RUN_ID="run",
               EXPERIMENT_DIR=str(tmp_path / "experiment"), DATA_PATH=str(SAMPLE / "train"),
               EVAL_ITERS="0", LR="1e-3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), MIN_LR="1e-4", CUDA_VISIBLE_DEVICES=os.environ.get(
                   "CUDA_VISIBLE_DEVICES", "0"))
    env.update({k: str(v) for k, v in toggles.items()})
    proc = subprocess.Popen(["bash", str(REPO / script), *words],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # The local backend's tiny run hung here on 2 H200s (2026-11-30): print where.
        launchers = subprocess.run(["pgrep", "-f", f"torchrun.*run-dir {tmp_path}"],
                                   capture_output=True, text=True).stdout.split()
        for pid in launchers:  # the workers (children of torchrun) print their stacks
            subprocess.run(["pkill", "-USR1", "-P", pid], check=False)
        time.sleep(5)
        subprocess.run(["pkill", "-KILL", "-f", f"run-dir {tmp_path}"], check=False)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{name}: no end after {timeout_s} s; the stacks at that moment "
                    f"(SIGUSR1):\n{out[-3000:]}\n{err[-12000:]}")
    run = tmp_path / "experiment" / name / str(toggles.get("PRECISION", "bf16")) / "run"
    log = out[-4000:] + err[-4000:]
    assert (run / "metrics.jsonl").exists(), log
    return run


def _losses(run: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {m["iteration"]: m["loss"] for m in lines if m.get("loss") is not None}


def _mean_loss(losses: dict[int, float], first: int, last: int) -> float:
    return sum(losses[i] for i in range(first, last + 1)) / (last - first + 1)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny 30-iteration run of a backend, trained once per module (the backend test and
    the comparison share it); a run that failed fails again without training again."""
    runs: dict[str, Path | BaseException] = {}

    def run(backend: str) -> Path:
        if backend not in runs:
            try:
                runs[backend] = _train(tmp_path_factory.mktemp(backend), f"tiny-{backend}",
                                       TRANSFORMER_IMPL=backend, TOTAL_ITERS=30)
            except BaseException as err:  # pytest's skip and fail too
                runs[backend] = err
                raise
        if isinstance(runs[backend], BaseException):
            raise runs[backend]
        return runs[backend]

    return run


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_trains_30_iterations_along_the_recorded_curve(tiny_run, backend):
    """The late loss (iterations 26-30) within LATE_LOSS_TOL of the backend's recorded value
    (6.198 for native and local).

    Mutation meant: labels=batch["tokens"] in training/pretrain_gpt.py forward_step (predict
    the token itself: the loss falls towards 0): the old bound (a fall of more than 1.0 from
    iterations 1-5) passes it, as it passes a run that learns just over 1.0 of the recorded
    2.47. Expected to fail; not run by hand: there is no GPU here.

    A backend with no recorded run (transformer_engine until its first GPU log is recorded)
    is checked for learning only (a fall of UNRECORDED_MIN_FALL, finite losses) and its late
    loss printed to be recorded; the TE case also checks the TE path ran with every
    default-on toggle and names each linear's wgrad kernel."""
    run = tiny_run(backend)
    losses = _losses(run)
    assert sorted(losses) == list(range(1, 31))
    first, last = _mean_loss(losses, 1, 5), _mean_loss(losses, 26, 30)
    recorded = RECORDED_LATE_LOSS.get(backend)
    print(f"\n{backend}: loss {first:.3f} (iters 1-5) -> {last:.3f} (iters 26-30); recorded "
          f"{recorded if recorded is not None else 'none yet: record this run'}")
    if recorded is not None:
        assert abs(last - recorded) < LATE_LOSS_TOL, \
            f"{backend}: late loss {last:.3f}, recorded {recorded} +- {LATE_LOSS_TOL}"
    else:
        assert all(v == v and v < 20 for v in losses.values()), losses     # finite
        assert last < first - UNRECORDED_MIN_FALL, (first, last)
    section = json.loads((run / "manifest.json").read_text())["run"]
    summary, timeline = section["summary"], section["timeline"]
    assert summary["measured"] and summary["tokens_per_s_per_gpu"] > 0
    order = ["worker_start", "torch_imported", "imports_done", "first_step_start",
             "training_done"]
    assert [timeline[k] for k in order] == sorted(timeline[k] for k in order)
    # the peak split at zero_grad and the optimizer step: the phases make up the run's peak
    phases = summary["peak_allocated_gib_by_phase"]
    assert set(phases) == {"forward_backward", "optimizer_step", "between_steps"}
    assert max(phases.values()) == summary["peak_allocated_gib_max_over_ranks"]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "step_time_s" in m]
    assert all(0 < m["mem_peak_fwd_bwd_gib"] <= m["mem_peak_allocated_gib"] and
               0 < m["mem_peak_step_gib"] <= m["mem_peak_allocated_gib"] for m in steps)
    print(f"{backend}: peak GiB by phase {json.dumps(phases)}")
    # the ROCm fork's closing lines, after ours, in the log its users grep (issue 20)
    log = (run / "train.log").read_text().splitlines()
    ours = max(i for i, line in enumerate(log) if line.startswith("[summary] tokens/s/GPU"))
    fork = [line.split(": ")[0] for line in log[ours + 1:ours + 5]]
    assert fork == ["throughput per GPU", "elapsed time per iteration", "tokens/GPU/s",
                    "mem usages"], log[ours:ours + 5]
    assert 0 < float(log[ours + 4].split(": ")[1]) < 1
    if backend == "transformer_engine":
        check_te_path_ran_with_every_default_on_toggle(run)


def check_te_path_ran_with_every_default_on_toggle(run: Path) -> None:
    """Issue 19: the TE path at the launcher's defaults, gradient-accumulation fusion included
    (the output layer, Megatron's own ColumnParallelLinear, on apex's or the native kernel)."""
    from training.launch.toggles import PERF_TOGGLES

    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["backend"] == "transformer_engine"
    for toggle in PERF_TOGGLES:
        assert manifest["values"][toggle.name] is True, toggle.name
    parts = manifest["run"]["transformer_engine"]
    print(f"transformer_engine: {json.dumps(parts)}")
    assert parts["wgrad_te_linears"].startswith("Transformer Engine")
    # the output layer: ours (the patch table's native_wgrad) or apex's, where Megatron has it
    assert ("training.native.wgrad.TorchWgradAccum" in parts["wgrad_megatron_linears"]
            or parts["wgrad_megatron_linears"] == "fused_weight_gradient_mlp_cuda (Megatron's)")
    assert manifest["run"]["native"] is None


def test_backends_learn_the_same_curve(tiny_run):
    """Every recorded backend's late loss (iterations 26-30) within BACKEND_TOL of the
    others'; an unrecorded one (transformer_engine) is printed beside them, not compared.

    Mutation meant: a slip in one backend that still learns, e.g. the native RMSNorm's eps
    read as 1e-2 instead of the preset's 1e-5 (training/native/norm.py NativeRMSNorm; at
    init the hidden states' mean square is ~4e-4, so the norm's output shrinks ~5x), which
    moves the native curve and not the local one. Expected to fail; not run by hand: there is
    no GPU here."""
    late = {b: _mean_loss(_losses(tiny_run(b)), 26, 30) for b in BACKENDS}
    print(f"\nlate loss by backend: {json.dumps(late)}")
    recorded = [v for b, v in late.items() if b in RECORDED_LATE_LOSS]
    assert max(recorded) - min(recorded) < BACKEND_TOL, late


def test_checkpoint_resume_continues_the_loss_curve(tmp_path):
    check_resume_continues_the_loss_curve(tmp_path)


def test_moe_checkpoint_resume_continues_the_loss_curve(tmp_path):
    check_resume_continues_the_loss_curve(tmp_path, script="examples/moe/train_qwen3_moe.sh",
                                          TRANSFORMER_IMPL="native")


def check_resume_continues_the_loss_curve(tmp_path: Path, script: str = SCRIPT, **toggles
                                          ) -> None:
    """20 iterations saved at 10 and 20, against a resume from 10 (saved at 20 elsewhere): the
    same losses for 11-20 and the same final weights and optimizer state, bit for bit; then an
    extension: a run of TOTAL_ITERS=10 on the 20-iteration schedule (WARMUP_ITERS and
    LR_DECAY_ITERS of the straight run), continued to TOTAL_ITERS=20 from its own folder (the
    launcher takes the checkpoint's schedule: RESUME_SCHEDULE=auto, no Megatron assert), again
    the straight run's losses and weights."""
    ckpt = tmp_path / "ckpt"
    full = _train(tmp_path, "full", script=script, TOTAL_ITERS=20, SAVE=ckpt, SAVE_INTERVAL=10,
                  **toggles)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "20"
    resumed = _train(tmp_path, "resumed", "--ckpt-step", "10", script=script, TOTAL_ITERS=20,
                     LOAD=ckpt, SAVE=tmp_path / "resumed-ckpt", SAVE_INTERVAL=10, **toggles)
    a, b = _losses(full), _losses(resumed)
    assert sorted(b) == list(range(11, 21)), sorted(b)
    worst = max(abs(a[i] - b[i]) / a[i] for i in range(11, 21))
    print(f"\nresume {toggles}: worst relative loss difference over iterations 11-20: "
          f"{worst:.2e}")
    assert [a[i] for i in range(11, 21)] == [b[i] for i in range(11, 21)], (a, b)
    check_same_weights(ckpt / "iter_0000020", tmp_path / "resumed-ckpt" / "iter_0000020")

    ext = tmp_path / "ext"
    first = _train(tmp_path, "ext-first", script=script, TOTAL_ITERS=10, WARMUP_ITERS=2,
                   LR_DECAY_ITERS=20, SAVE=ext, SAVE_INTERVAL=10, **toggles)
    rest = _train(tmp_path, "ext-rest", script=script, TOTAL_ITERS=20, LOAD=ext, SAVE=ext,
                  SAVE_INTERVAL=10, **toggles)
    manifest = json.loads((rest / "manifest.json").read_text())
    assert manifest["values"]["RESUME_SCHEDULE"] == "checkpoint"
    c, d = _losses(first), _losses(rest)
    assert sorted(c) == list(range(1, 11)) and sorted(d) == list(range(11, 21))
    assert [a[i] for i in range(1, 21)] == [c[i] for i in range(1, 11)] + \
        [d[i] for i in range(11, 21)], (a, c, d)
    check_same_weights(ckpt / "iter_0000020", ext / "iter_0000020")


def check_same_weights(one: Path, other: Path) -> None:
    """Every tensor of two torch_dist checkpoints (weights, optimizer state) equal, bit for
    bit; read on the CPU with torch.distributed.checkpoint."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    def tensors(folder: Path) -> dict:
        meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
        state = {key: torch.empty(m.size, dtype=m.properties.dtype) for key, m in meta.items()
                 if isinstance(m, TensorStorageMetadata)}
        load(state, storage_reader=FileSystemReader(str(folder)), no_dist=True)
        return state

    a, b = tensors(one), tensors(other)
    assert sorted(a) == sorted(b) and a
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    print(f"{len(a)} tensors compared, {len(differ)} differ: {differ[:5]}")
    assert not differ


def test_empty_load_is_refused_before_training(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(os.environ, MODEL_SIZE="tiny", LOAD=str(empty),
               EXPERIMENT_DIR=str(tmp_path / "experiment"))
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "[load_checkpoint]" in proc.stderr and "RESUME=auto" in proc.stderr
