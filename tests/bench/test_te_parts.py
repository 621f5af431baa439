"""The Transformer Engine parts of `bench all --te`: Megatron-LM with TE as a peer (our launcher
at Megatron's own defaults), every recipe a lever on the TE backend, TE's default-on toggles
off; decided with the launcher's own guards on an H200 (PLATFORM=h200: its image has TE)."""
from __future__ import annotations

from pathlib import Path

import pytest

from training.bench import __main__ as cli
from training.bench import plan, sweep
from training.bench.analysis import peers_results
from training.bench.catalog import (PART_BACKEND, TE_PARTS, megatron_defaults, select)
from training.bench.ours import precheck
from training.bench.shape import BenchShape
from training.bench.suites import peer_configs, toggle_configs
from training.launch.resolve import resolve
from training.launch.toggles import BY_NAME, PERF_TOGGLES

from .fakes import FakeRunner

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
SHAPE = BenchShape(repeats=2)


@pytest.fixture
def h200(base_env):
    env = dict(base_env, PLATFORM="h200")
    return lambda toggles: precheck(toggles, environ=env)


@pytest.mark.slow
def test_megatrons_defaults_are_the_values_that_emit_no_flag():
    """...or, for a toggle that emits a flag either way, Megatron's own TransformerConfig
    default (FUSED_SINGLE_QKV_ROPE: Megatron has no flag for it, our argument sets the field)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from training.arguments import TOGGLE_OF
    from training.bench.catalog import MEGATRON_FIELD_DEFAULTS

    env = megatron_defaults()
    field_of = {toggle: dest for dest, toggle in TOGGLE_OF.items()}
    for name, value in env.items():
        toggle = BY_NAME[name]
        if name in MEGATRON_FIELD_DEFAULTS:
            default = TransformerConfig.__dataclass_fields__[field_of[name]].default
            assert value == str(int(default)), name
        elif toggle.kind == "bool":
            assert toggle.flags_for(value == "1") == [], name
    assert {t.name for t in PERF_TOGGLES} <= set(env)
    assert env["GRADIENT_ACCUMULATION_FUSION"] == "1"       # Megatron's own default is on
    assert env["GRAD_REDUCE_IN_BF16"] == env["DISTRIBUTED_OPTIMIZER"] == "0"
    assert env["NAN_CHECK"] == "bucket"


def test_megatron_te_peer_launches_the_te_spec_with_no_launcher_flag(base_env):
    env = dict(base_env, PLATFORM="h200", DRY_RUN="1", TRANSFORMER_IMPL="transformer_engine",
               **megatron_defaults())
    launch = resolve("llama3", env)
    words = [w for bucket in launch.buckets.values() for w in bucket]
    assert words[words.index("--transformer-impl") + 1] == "transformer_engine"
    for flag in ("--grad-reduce-in-bf16", "--cross-entropy-loss-fusion", "--fused-single-qkv-rope",
                 "--ddp-average-in-collective", "--use-distributed-optimizer",
                 "--overlap-grad-reduce", "--no-gradient-accumulation-fusion",
                 "--no-check-for-nan-in-loss-and-grad"):
        assert flag not in words, flag
    assert not [s for s in launch.settings.values.values() if s.source == "guard"]


def test_peers_te_runs_ours_megatron_te_and_our_te_backend(h200):
    _kind, _name, sides = TE_PARTS[0]
    configs = peer_configs(SHAPE, list(sides), h200, lambda side: None)
    assert [c.id for c in configs] == ["native", "megatron_te", "transformer_engine"]
    assert all(c.runnable and c.side == "ours" for c in configs)
    assert configs[1].env["TRANSFORMER_IMPL"] == "transformer_engine"
    assert len(sweep.order(configs, SHAPE)) == 6
    runner = FakeRunner(speed={"native": 37000.0, "megatron_te": 33000.0,
                               "transformer_engine": 36000.0})
    data = {"configs": [c.to_dict() for c in configs],
            "points": [dict(runner(s), config=s.config, repeat=s.repeat)
                       for s in sweep.order(configs, SHAPE)]}
    rows = {r["key"]: r for r in peers_results(data)}
    assert rows["peer:megatron_te"]["kind"] == "peer"
    assert rows["peer:megatron_te"]["tokens_per_s_ratio"] == pytest.approx(37 / 33, rel=0.02)
    assert rows["TRANSFORMER_IMPL=transformer_engine"]["kind"] == "backend"
    assert rows["TRANSFORMER_IMPL=transformer_engine"]["baseline"] == \
        "TRANSFORMER_IMPL=transformer_engine"


def test_te_recipes_run_the_three_hopper_recipes_and_record_the_rest_refused(h200):
    kind, part, keys = TE_PARTS[1]
    shape = BenchShape(repeats=2, backend=PART_BACKEND[part])
    configs, values = toggle_configs(shape, select(shape, None, None, list(keys)), h200)
    assert values["TRANSFORMER_IMPL"] == "transformer_engine"
    status = {c.id: c.status for c in configs}
    assert status == {"default": "planned", "PRECISION=fp8": "planned",
                      "PRECISION=fp8_tensorwise": "planned",
                      "PRECISION=fp8_blockwise": "planned", "PRECISION=mxfp8": "refused",
                      "PRECISION=mxfp4": "refused", "PRECISION=nvfp4": "refused"}


@pytest.mark.parametrize("index", [2, 3])
def test_te_toggle_parts_switch_te_paths_default_on_toggles_off(h200, index):
    _kind, part, keys = TE_PARTS[index]
    shape = BenchShape(repeats=2, backend=PART_BACKEND[part])
    configs, values = toggle_configs(shape, select(shape, None, None, list(keys)), h200)
    assert values["TRANSFORMER_IMPL"] == "transformer_engine"
    assert all(c.runnable and not c.corrections for c in configs), \
        [(c.id, c.status, c.message, c.corrections) for c in configs]


# The one-GPU TE session's two bench calls (dev/gpu_runbook.md, TE-b and TE-c): `bench.sh 1
# <parts> --te --repeats 1 --budget-s 540`, each inside a device call's 10 minutes with the
# wheels' install and the idle check. The estimates come from the recorded TE runs (~70 s each
# in session 10, the 47 s of a native run before the calibration knew the backend).
ONE_GPU_CALLS = (("peers-te", "te-recipes"), ("te-toggles-a", "te-toggles-b"),
                 ("te-documents",))    # issue 51: dev/gpu/documents.sh TE=1, or bench.sh
ONE_GPU_BUDGET_S = 540


def test_te_parts_fit_two_one_gpu_calls_at_one_repeat(h200):
    """The runbook's calls plan every run of their parts inside their budget (estimates from the
    recorded benchmarks): peers-te with te-recipes in the first (the issue's bar), the TE
    toggles in the second; at two repeats the first would not fit."""
    cal = plan.calibrate(BENCH)
    by_part = {part: (kind, keys) for kind, part, keys in TE_PARTS}

    def total(parts, repeats):
        seconds = 0.0
        for part in parts:
            kind, keys = by_part[part]
            shape = BenchShape(repeats=repeats, backend=PART_BACKEND.get(part))
            if kind == "toggles":
                configs, _ = toggle_configs(shape, select(shape, None, None, list(keys)), h200)
            else:
                configs = peer_configs(shape, list(keys), h200, lambda side: None)
            seconds += sum(plan.estimate(s, cal) for s in sweep.order(configs, shape))
        return seconds

    assert [p for call in ONE_GPU_CALLS for p in call] == [part for _k, part, _ in TE_PARTS]
    totals = [total(call, 1) for call in ONE_GPU_CALLS]
    assert all(t <= ONE_GPU_BUDGET_S for t in totals), totals
    assert total(ONE_GPU_CALLS[0], 2) > ONE_GPU_BUDGET_S
    print(f"\nTE bench calls at 1 repeat: {[round(t) for t in totals]} s")


def test_bench_all_te_lists_only_the_te_parts_and_writes_nothing_without_te(tmp_path, capsys,
                                                                         monkeypatch, base_env):
    """Here (no TE) every TE part has nothing to measure: none is written, so the TE session
    still finds them undone. The real precheck: the launcher's resolve and guards on this node."""
    import functools

    from training.bench.ours import precheck

    monkeypatch.setattr(cli, "_tools", lambda _a: (functools.partial(precheck, environ=base_env),
                                                    lambda side: None, FakeRunner(),
                                                    plan.calibrate(BENCH)))
    monkeypatch.setattr(cli.record, "BENCH_DIR", tmp_path / "committed")
    monkeypatch.setattr(cli.record, "gpu_info", lambda: {"name": "NVIDIA H200", "count": 1})
    out = tmp_path / "out"
    assert cli.main(["all", "--te", "--repeats", "2", "--out-dir", str(out)]) == 0
    text = capsys.readouterr().out
    for _kind, part, _keys in TE_PARTS:
        assert f"{part}_h200_" in text
    assert "  toggles-a_h200" not in text and "nothing to measure here" in text
    assert not list(out.glob("*.json"))


def test_the_te_image_default_parts_measure_auto_where_te_imports(monkeypatch):
    """moe-te-default(-mixtral): the auto side carries no TRANSFORMER_IMPL (neither its own nor
    the part shape's), so the launch's rule picks the backend; where TE does not import the
    whole part is refused (auto would be the native backend under another name)."""
    import importlib.util

    from training.bench.catalog import MOE_TE_PARTS, PART_SHAPES
    from training.bench.sweep import Config

    parts = {name: keys for _kind, name, keys in MOE_TE_PARTS}
    for name in ("moe-te-default", "moe-te-default-mixtral"):
        assert parts[name] == ("auto", "native", "hf_compile")
        assert PART_SHAPES[name].backend is None
        assert "TRANSFORMER_IMPL" not in PART_SHAPES[name].env()
    assert PART_SHAPES["moe-te-default-mixtral"].family == "mixtral"
    assert PART_SHAPES["moe-te-peers"].backend == "transformer_engine"

    def configs():
        return [Config("auto", "ours", {}), Config("native", "ours",
                                                   {"TRANSFORMER_IMPL": "native"}),
                Config("hf_compile", "hf_compile")]

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        object() if name == "transformer_engine" else real(name, *a)))
    present = configs()
    cli._auto_needs_te(present)
    assert all(c.runnable for c in present)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name == "transformer_engine" else real(name, *a)))
    absent = configs()
    cli._auto_needs_te(absent)
    assert not any(c.runnable for c in absent)
    assert "Transformer Engine does not import here" in absent[0].message
    others = [Config("native", "ours", {"TRANSFORMER_IMPL": "native"})]
    cli._auto_needs_te(others)                     # a part without auto: untouched
    assert others[0].runnable
