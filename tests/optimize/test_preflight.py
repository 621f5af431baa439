"""The launcher's memory pre-flight (training/optimize/preflight.py: the launcher's command line
with the check, what examples/lib/launch.sh runs): the issue's out-of-memory launch refused
before torchrun with the estimate by term and the levers that fit; warn/off; the 90-100%
warning; no known GPU; the recommended toggles."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from training.launch.capabilities import Capabilities
from training.launch.settings import LaunchError
from training.optimize.preflight import check, recommended
from training.optimize.preflight import main as preflight_main

from ..launch.helpers import launch

REPO = Path(__file__).resolve().parents[2]
# the issue's launch: full Llama3-8B, seq 8192, one GPU, global batch 8
OOM = {"BS": 8, "TOTAL_ITERS": 6, "GPUS_PER_NODE": 1}
H200_NATIVE = {"PLATFORM": "h200", "TRANSFORMER_IMPL": "native"}


def checked(env, **toggles):
    """A launch resolved and pre-flighted, as the launcher's command line does it."""
    result = launch(env, **toggles)
    check(result)
    return result


def _notices(result, level):
    return [n.message for n in result.settings.notices
            if n.guard == "preflight_memory" and n.level == level]


def test_the_issues_launch_is_refused_by_the_script_before_torchrun(tmp_path):
    """`BS=8 TOTAL_ITERS=6 GPUS_PER_NODE=1 bash examples/llama/train_llama3.sh` with the H200
    named (DRY_RUN: this machine has no GPU): exit 2, no run folder, the estimate by term and
    the levers that make it fit, each with its estimate."""
    env = dict(os.environ, **{k: str(v) for k, v in OOM.items()}, PLATFORM="h200", DRY_RUN="1",
               EXPERIMENT_DIR=str(tmp_path / "experiment"))
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr
    assert "[preflight_memory]" in err and "above the GPU's memory" in err
    for label in ("bf16 weights", "fp32 main params", "Adam moments", "activations"):
        assert label in err
    assert "MASTER_WEIGHTS=remainder" in err and "ADAM_MOMENTS_DTYPE=bf16" in err
    assert "try: DRY_RUN=1 bash examples/llama/train_llama3.sh" in err
    assert "torchrun" not in proc.stdout and not (tmp_path / "experiment").exists()


def test_a_real_launch_on_an_h200_node_is_refused_by_the_launchers_command_line(
        base_env, monkeypatch, capsys):
    """Without DRY_RUN, on a node whose GPU is detected as an H200: exit 2 before the shell
    assignments the script would exec torchrun from, with the levers in the advisor's order."""
    from training.launch import capabilities

    node = Capabilities(platform="h200", source="detected", device_name="NVIDIA H200",
                        gpu_count=1, transformer_engine=False, apex_fused_wgrad=False,
                        liger=True, flash_attn=False)
    monkeypatch.setattr(capabilities, "detect", lambda: node)
    for key, value in {**base_env, **OOM}.items():
        monkeypatch.setenv(key, str(value))
    assert preflight_main(["--family", "llama3"]) == 2
    out, err = capsys.readouterr()
    assert "[preflight_memory]" in err and "fits with the levers below" in err
    assert err.index("MASTER_WEIGHTS=remainder") < err.index("ADAM_MOMENTS_DTYPE=bf16")
    assert "GPT_ARGS=" not in out


def test_the_levers_it_quotes_make_the_launch_fit(base_env):
    sets = recommended("llama3", {**base_env, **{k: str(v) for k, v in OOM.items()},
                                  **H200_NATIVE})
    assert sets == {"MASTER_WEIGHTS": "remainder", "ADAM_MOMENTS_DTYPE": "bf16"}
    result = checked(base_env, **OOM, **H200_NATIVE, **sets)
    fits = _notices(result, "info")
    assert fits and "fits" in fits[0] and not _notices(result, "warning")


def test_the_cli_prints_them_for_the_bench(base_env, monkeypatch, capsys):
    for key, value in {**base_env, **OOM, **H200_NATIVE}.items():
        monkeypatch.setenv(key, str(value))
    assert preflight_main(["--recommend", "--family", "llama3"]) == 0
    assert capsys.readouterr().out.strip() == "MASTER_WEIGHTS=remainder,ADAM_MOMENTS_DTYPE=bf16"


def test_warn_launches_with_the_same_text_and_off_skips(base_env):
    warned = checked(base_env, **OOM, **H200_NATIVE, PREFLIGHT_MEMORY="warn")
    assert "above the GPU's memory" in _notices(warned, "warning")[0]
    off = checked(base_env, **OOM, **H200_NATIVE, PREFLIGHT_MEMORY="off")
    assert not _notices(off, "warning") and "not checked" in _notices(off, "info")[0]


def test_between_90_and_100_percent_it_warns(base_env):
    """bf16 moments with an fp32 master copy: the estimate lands between 90% and 100%."""
    result = checked(base_env, **OOM, **H200_NATIVE, ADAM_MOMENTS_DTYPE="bf16")
    warning = _notices(result, "warning")
    assert warning and "above 90%" in warning[0] and "MASTER_WEIGHTS=remainder" in warning[0]


def test_without_a_known_gpu_the_check_says_it_was_skipped(base_env):
    result = checked(base_env, **OOM)   # this CPU machine, PLATFORM=auto
    assert "skipped" in _notices(result, "info")[0]


def test_a_launch_that_fits_gets_one_info_line(base_env):
    result = checked(base_env, NUM_LAYERS=8, **OOM, **H200_NATIVE)
    assert not _notices(result, "warning") and "fits" in _notices(result, "info")[0]


def test_cpu_offload_is_a_last_resort_proposed_only_where_the_run_then_fits(base_env):
    """Full Llama3-8B on one H100 (80 GiB, TE's image: no stochastic rounding): the lighter
    states and full recompute leave it at the GPU's size; offloading the (fp32) state fits."""
    from training.optimize.preflight import _estimate, levers_to_fit

    result = launch(base_env, BS=8, GPUS_PER_NODE=1, PLATFORM="h100", TRANSFORMER_IMPL="native",
                    PREFLIGHT_MEMORY="off")
    flow = levers_to_fit(*_estimate(result))  # PREFLIGHT_MEMORY=off: the levers all the same
    sets = [r["set"] for r in flow["recommendations"]]
    assert sets[-1].startswith("OPTIMIZER_CPU_OFFLOAD=1") and "RECOMPUTE=full" in sets
    assert flow["recommendations"][-2]["estimate"]["fits"] is False
    assert flow["fits"] is True


def test_no_offload_where_it_would_not_make_the_run_fit():
    from .helpers import DRY_70B, advise

    sets = [r["set"] for r in advise(DRY_70B)["recommendations"]]
    assert sets[-1].startswith("TP=") and not any("OFFLOAD" in s for s in sets)


def test_a_lever_that_sets_back_an_earlier_ones_toggle_says_so():
    """The MoE pre-flight recommended bf16 optimizer state, then the CPU offload, and its try
    line set the state back to fp32 without a word: the report names it and the reason."""
    from training.optimize.preflight import taken_back

    recs = [{"title": "bf16 Adam moments", "sets": {"ADAM_MOMENTS_DTYPE": "bf16"}},
            {"title": "16-bit master remainders", "sets": {"MASTER_WEIGHTS": "remainder"}},
            {"title": "optimizer state offloaded to the CPU",
             "mechanism": "it keeps fp32 state: the state dtypes go back to fp32",
             "sets": {"OPTIMIZER_CPU_OFFLOAD": "1", "ADAM_MOMENTS_DTYPE": "fp32",
                      "MASTER_WEIGHTS": "fp32"}}]
    (note,) = taken_back(recs)
    assert note == ("lever 3 (optimizer state offloaded to the CPU) sets ADAM_MOMENTS_DTYPE=fp32 "
                    "MASTER_WEIGHTS=fp32 again, over levers 1, 2: it keeps fp32 state: the "
                    "state dtypes go back to fp32")
    assert taken_back(recs[:2]) == []
