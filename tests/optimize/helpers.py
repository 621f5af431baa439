"""Paths and small helpers for the optimize advisor's tests."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "tests" / "data" / "runs"
DRY = REPO / "tests" / "data" / "optimize"
FIXTURE = REPO / "tests" / "data" / "levers_fixture.json"

NATIVE = RUNS / "h200_l8_native"
LOCAL = RUNS / "h200_l8_local"
PROFILED = RUNS / "h200_l8_native_profiled"
FULL_32L = RUNS / "h200x2_l32_native"                      # Llama3-8B, 2 H200s, DP=2
FULL_32L_RECOMPUTE = RUNS / "h200x2_l32_native_full_recompute"
# recorded with the peak split by phase (training/loop_hooks.PhasePeaks), session 6
PHASES = RUNS / "h200_l8_native_phases"
PHASES_RECOMPUTE = RUNS / "h200_l8_native_full_recompute_phases"
# the optimizer-state toggles on one H200 (session 8; the peak split by phase too)
OPT_BF16 = RUNS / "h200_l8_native_opt_state_bf16"           # bf16 moments, remainder masters
OPT_BF16_SR = RUNS / "h200_l8_native_opt_state_bf16_sr"     # bf16 moments, stochastic rounding
FULL_32L_OPT_BF16 = RUNS / "h200_l32_native_opt_state_bf16"  # full Llama3-8B, one H200
CPU_OFFLOAD = RUNS / "h200_l8_native_cpu_offload"           # OPTIMIZER_CPU_OFFLOAD=1
# Qwen3-30B-A3B cut to 8 layers on one H200 (session 11): the lean MoE step, the core defaults
MOE_LEAN = RUNS / "h200_l8_moe_lean"
MOE_CORE = RUNS / "h200_l8_moe_core"
DRY_SEQ32K = DRY / "dry_8b_seq32k_mbs4"
DRY_70B = DRY / "dry_70b_1gpu"
DRY_ALL_ON = DRY / "dry_8b_8gpu_mbs2"


def copy_run(src: Path, dst: Path) -> Path:
    """A writable copy of a recorded run folder (the advisor writes optimize.json into it)."""
    shutil.copytree(src, dst)
    return dst


def fixture_levers() -> dict:
    return json.loads(FIXTURE.read_text())


def write_levers(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def edit_manifest(run: Path, fn) -> None:
    path = run / "manifest.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from training.optimize.__main__ import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def advise(run: Path, levers: Path | None = FIXTURE, platform: str | None = None, **want):
    from training.optimize import levers as levers_mod
    from training.optimize.advisor import advise as _advise
    from training.optimize.inputs import load_run

    book = levers_mod.load(levers) if levers else levers_mod.empty("no levers file (test)")
    return _advise(load_run(run), book, platform=platform, want=want)
