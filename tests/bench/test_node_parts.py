"""Issue 27's full-node parts (2 and 8 H200s): every launch they make resolves through the
launcher on an H200 node (PLATFORM=h200, DRY_RUN), or is refused there by a named guard before
any GPU work; each device call of dev/gpu_runbook.md plans inside one command."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from training.bench import catalog, plan, sweep
from training.bench.__main__ import parts_for
from training.bench.ours import precheck
from training.bench.suites import toggle_configs
from training.launch.presets import SCRIPTS
from training.optimize.preflight import recommended

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "benchmarks"
BUDGET_S = 510            # `bench all`'s default budget: one ~9-minute device call
# (gpus, te) -> the parts `bench all` runs there
NODE_PARTS = {(2, False): ["dp2-comm", "dp2-optimizer", "dp2-overlap", "full-x2", "moe-ep2"],
              (8, False): ["full-x8", "node-dp-comm", "node-dp-optimizer", "node-dp-overlap",
                           "moe-ep8", "node-toggles"],
              (2, True): ["full-x2-te"], (8, True): ["full-x8-te"]}
OWN_SHAPE = [(g, te, kind, part, keys) for (g, te) in NODE_PARTS
             for kind, part, keys in parts_for(g, te) if part in catalog.PART_SHAPES] \
    + [(1, False, kind, part, keys) for kind, part, keys in parts_for(1)
       if part == "scale-x1"]
# refused on an H200 node, decided before any GPU work: part -> {lever: guard}
REFUSED = {"moe-ep2": {"MOE_TOKEN_DISPATCHER=flex": "moe_dispatcher_kernels"},
           "moe-ep8": {"MOE_TOKEN_DISPATCHER=flex": "moe_dispatcher_kernels"},
           "node-dp-optimizer": {"DISTRIBUTED_OPTIMIZER": "preflight_memory"}}
# the runbook's device calls: (gpus, te, parts of one call)
CALLS = [(2, False, ("full-x2", "moe-ep2")), (1, False, ("scale-x1",)),
         (8, False, ("full-x8", "moe-ep8")), (8, False, ("node-dp-comm",)),
         (8, False, ("node-dp-optimizer",)), (8, False, ("node-dp-overlap",)),
         (8, False, ("node-toggles",)), (2, True, ("full-x2-te",)), (8, True, ("full-x8-te",))]


@pytest.fixture
def h200(base_env):
    env = dict(base_env, PLATFORM="h200")
    return lambda family: (lambda toggles: precheck(toggles, family=family, environ=env))


def _configs(part, keys, h200):
    shape = catalog.PART_SHAPES[part]
    return shape, toggle_configs(shape, catalog.select(shape, None, None, list(keys)),
                                 h200(shape.family))


def test_parts_per_gpu_count():
    for (gpus, te), names in NODE_PARTS.items():
        assert [part for _kind, part, _keys in parts_for(gpus, te)] == names
    assert "scale-x1" in [part for _k, part, _ks in parts_for(1)]


@pytest.mark.parametrize("gpus,te,kind,part,keys", OWN_SHAPE, ids=lambda v: str(v))
def test_every_launch_resolves_on_an_h200_node_or_is_refused_by_a_guard(h200, gpus, te, kind,
                                                                         part, keys):
    shape, (configs, values) = _configs(part, keys, h200)
    assert shape.gpus == gpus and shape.describe().layout.world_size == gpus
    assert values["GPUS_PER_NODE"] == str(gpus)
    refused = REFUSED.get(part, {})
    for config in configs:
        if config.id in refused:
            assert config.status == "refused" and f"[{refused[config.id]}]" in config.message, \
                (config.id, config.message)
        else:
            assert config.status == "planned", (config.id, config.status, config.message)
    backend = "transformer_engine" if te else "native"
    assert values["TRANSFORMER_IMPL"] == backend
    if part.startswith("moe-ep"):
        assert values["EP"] == str(gpus) and values["MOE_TOKEN_DISPATCHER"] == "alltoall"


def test_full_model_shapes_keep_eight_sequences_per_gpu():
    full = {p: catalog.PART_SHAPES[p] for p in ("scale-x1", "full-x2", "full-x8", "full-x2-te",
                                                "full-x8-te")}
    for shape in full.values():
        assert (shape.num_layers, shape.seq_length, shape.mbs) == (32, 8192, 1)
        assert shape.global_batch == catalog.FULL_PER_GPU_BATCH * shape.gpus
        assert shape.preset == "llama3-8B" and shape.tag() == "llama3-8B_seq8192"
    for ep in (2, 8):
        moe = catalog.PART_SHAPES[f"moe-ep{ep}"]
        assert moe.tag() == catalog.MOE_SHAPE.tag()
        assert moe.global_batch // moe.gpus == catalog.MOE_SHAPE.global_batch


def test_the_one_gpu_point_takes_the_state_the_preflight_recommends(base_env):
    """scale-x1's default run is the full model with the optimizer-state lever that the 2- and
    8-GPU parts measure as their variant; it is what the pre-flight recommends on one H200
    (without it the launcher refuses the full model there)."""
    shape = catalog.PART_SHAPES["scale-x1"]
    state = dict(shape.toggles)
    lever = next(lv for lv in catalog.all_levers(shape) if lv.key == catalog.SCALE_STATE)
    assert state == lever.env
    env = dict(base_env, PLATFORM="h200", DRY_RUN="1",
               **{k: v for k, v in shape.env().items() if k not in state})
    assert env["TRANSFORMER_IMPL"] == "native"
    assert precheck(env, environ=base_env)["status"] == "refused"
    rec = recommended("llama3", env)
    assert {k: v for k, v in rec.items() if k in state} == state, rec


@pytest.mark.parametrize("gpus,te,parts", CALLS, ids=lambda v: str(v))
def test_each_runbook_call_plans_inside_one_command(h200, gpus, te, parts):
    cal = plan.calibrate(BENCH)
    total = 0.0
    for _kind, part, keys in parts_for(gpus, te):
        if part in parts:
            shape, (configs, _values) = _configs(part, keys, h200)
            specs = sweep.order(configs, shape)
            assert {s.repeat for s in specs} == set(range(shape.repeats))
            total += sum(plan.estimate(s, cal) for s in specs)
    assert 0 < total <= BUDGET_S, (parts, total)


def _dry_run(tmp_path, family: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    import os
    import sys

    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable,
            "VERBOSE": "1",
            "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1", "PLATFORM": "h200",
            **env}
    return subprocess.run(["bash", str(REPO / SCRIPTS[family])], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("gpus,te,kind,part,keys", OWN_SHAPE, ids=lambda v: str(v))
def test_each_part_launches_through_its_example_script(tmp_path, h200, gpus, te, kind, part,
                                                       keys):
    """`GPUS_PER_NODE=N DRY_RUN=1 bash examples/...` with every planned run's toggles: one
    torchrun line over N GPUs of one node; a refused one exits 2 with the guard's line."""
    shape, (configs, _values) = _configs(part, keys, h200)
    for config in configs:
        proc = _dry_run(tmp_path, shape.family, {**shape.env(), **config.env})
        if config.status == "refused":
            assert proc.returncode == 2, proc.stdout[-500:]
            assert "error:" in proc.stderr and "Traceback" not in proc.stderr
            continue
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
        words = shlex.split(line)
        assert words[words.index("--nproc-per-node") + 1] == str(gpus)
        assert words[words.index("--num-layers") + 1] == str(shape.num_layers)
        assert words[words.index("--global-batch-size") + 1] == str(shape.global_batch)
        if part.startswith("moe-ep"):
            assert words[words.index("--expert-model-parallel-size") + 1] == str(gpus)
        for name, value in config.env.items():
            if name == "PRECISION" and value == "fp8":
                assert "--fp8-format" in words


def test_readme_headline_keeps_native_and_te_defaults_of_one_shape_apart(tmp_path):
    """full-x8 (native) and full-x8-te (TE) share a shape: each default is its own row, named
    by its backend."""
    import json

    from training.bench.readme import headline_rows

    shape = catalog.PART_SHAPES["full-x8"].to_dict()
    for name, backend, tps in (("full-x8", "native", 11000.0), ("full-x8-te", "transformer_engine",
                                                                 12000.0)):
        point = {"config": "default", "side": "ours", "repeat": 0, "backend": backend,
                 "tokens_per_s_per_gpu": tps, "model_tflops_per_gpu": tps / 20,
                 "peak_memory_gib": 60.0}
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"kind": "toggles", "name": name, "shape": shape, "gpu": {"name": "NVIDIA H200"},
             "created": "2026-12-02T00:00:00", "points": [point]}))
    rows = {label: summary["tokens_per_s"]["mean"]
            for label, _data, _path, summary in headline_rows(tmp_path)}
    assert rows == {"native (launcher default)": 11000.0,
                    "transformer_engine (launcher default)": 12000.0}
