"""Recipe layers (training/launch/layers.py): a family plugs into the launcher from above, and
the core imports none of them."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from training.launch.guards import Refusals
from training.launch.layers import RecipeLayer, RecipeValue
from training.launch.resolve import resolve
from training.launch.settings import Refusal
from training.launch.toggles import LAUNCHER, Toggle

REPO = Path(__file__).resolve().parents[2]
CORE = ("training/launch", "training/run_description.py", "training/platforms.py")
FAMILIES = ("training.mlperf", "training.moe")


def _toy_layer(refuse: bool = False) -> RecipeLayer:
    """A recipe of its own knob WIDGET, a core value derived from the user's BS, and a rule."""
    def values(settings):
        bs = settings["BS"] if settings.is_explicit("BS") else 64
        return [RecipeValue("WIDGET", "on", "the toy recipe"),
                RecipeValue("BS", bs, "the toy recipe's batch"),
                RecipeValue("TOTAL_ITERS", 40, "long enough"),
                RecipeValue("MIN_LR", 1e-5, "a tenth of nothing")]

    def toy_rule(ctx):
        """The toy recipe refuses when asked to."""
        if refuse:
            raise Refusal("toy_rule", "the toy recipe refuses")
        ctx.settings.info("toy_rule", f"WIDGET={ctx.settings['WIDGET']}")

    return RecipeLayer("toy", values, toggles=(Toggle("WIDGET", "choice", None, LAUNCHER,
                                                      "A toy knob.", choices=("on", "off"),
                                                      group="toy"),),
                       guards=(toy_rule,))


def test_a_layer_sets_what_the_user_left_unset_with_source_recipe(base_env):
    result = resolve("llama3", dict(base_env, DRY_RUN="1", MODEL_SIZE="tiny"),
                     layers=[_toy_layer()])
    s = result.settings
    assert (s["WIDGET"], s["BS"], s["TOTAL_ITERS"]) == ("on", 64, 40)
    assert s.setting("BS").source == "recipe" and s.setting("BS").reason == "toy: the toy recipe's batch"
    # the tiny preset's own BS 8 / TOTAL_ITERS 30 do not replace the layer's values
    assert s.setting("TOTAL_ITERS").reason == "toy: long enough"
    assert [t.name for t in result.toggles][-1] == "WIDGET"
    assert result.run["WIDGET"] == "on"
    assert [n.message for n in s.notices if n.guard == "toy_rule"] == ["WIDGET=on"]
    assert [r.name for r in result.recipe_values] == ["WIDGET", "BS", "TOTAL_ITERS", "MIN_LR"]


def test_a_layer_never_replaces_a_users_value(base_env):
    result = resolve("llama3", dict(base_env, DRY_RUN="1", MODEL_SIZE="tiny", BS="16"),
                     ["WIDGET=off"], layers=[_toy_layer()])
    s = result.settings
    assert (s["WIDGET"], s.setting("WIDGET").source) == ("off", "cli")
    assert (s["BS"], s.setting("BS").source) == (16, "env")
    assert "BS" not in [r.name for r in result.recipe_values]


def test_a_layers_refusals_are_reported_with_the_cores(base_env):
    with pytest.raises(Refusals) as err:
        resolve("llama3", dict(base_env, DRY_RUN="1", TP="3", GPUS_PER_NODE="8"),
                layers=[_toy_layer(refuse=True)])
    assert {r.guard for r in err.value.refusals} == {"parallel_sizes", "toy_rule"}


def test_without_the_layer_its_knob_is_no_toggle(base_env):
    result = resolve("llama3", dict(base_env, DRY_RUN="1", MODEL_SIZE="tiny"), ["WIDGET=on"])
    assert "WIDGET" not in result.settings.values
    assert result.passthrough_env == {"WIDGET": "on"}


def test_a_layer_may_not_redefine_a_core_toggle(base_env):
    clash = RecipeLayer("clash", lambda s: [], toggles=(Toggle("TP", "int", 1, LAUNCHER, "x"),))
    with pytest.raises(ValueError, match="redefines toggle TP"):
        resolve("llama3", dict(base_env, DRY_RUN="1"), layers=[clash])


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                names.add(".".join(base + ([node.module] if node.module else [])))
            else:
                names.add(node.module)
    return names


def test_the_core_imports_no_feature_family():
    """Static: no module of the core names training.mlperf (nor any family above it)."""
    files = [p for entry in CORE for p in
             ((REPO / entry).rglob("*.py") if (REPO / entry).is_dir() else [REPO / entry])]
    assert len(files) > 10
    offenders = {str(p.relative_to(REPO)): sorted(n for n in _imports(p)
                                                  if n.startswith(FAMILIES))
                 for p in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_a_launch_loads_no_feature_family(base_env):
    """At run time: resolving, reporting and writing a launch leaves training.mlperf unloaded."""
    code = ("import sys, os\n"
            "from training.launch.__main__ import main\n"
            "rc = main(['--family', 'llama3', 'MODEL_SIZE=tiny'])\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('training.mlperf'))\n"
            "print('LOADED', loaded, file=sys.stderr)\n"
            "sys.exit(rc or (1 if loaded else 0))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=dict(base_env, DRY_RUN="1", COLUMNS="200"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LOADED []" in proc.stderr


# -- a layer's variables given to an entry point that does not run the layer ------------------

def _layer_refusal(base_env, words=(), **env) -> str:
    with pytest.raises(Refusals) as err:
        resolve("llama3", dict(base_env, DRY_RUN="1", **env), list(words))
    text = str(err.value)
    assert "[layer_variables]" in text, text
    return text


def test_mlperf_variables_on_the_core_launch_are_refused_with_the_entry_to_use(base_env):
    """MLPERF_DIVISION=open with train_llama3.sh was silently ignored (the recipe layer runs only
    under run_llama31_8b.sh): refused, naming that script, from the environment or as a word;
    so is the run's own MLPERF_RUN, which would half-turn the run into an MLPerf one."""
    from training.launch.layers import ENTRIES

    script = next(e.script for e in ENTRIES if e.prefix == "MLPERF_")
    text = _layer_refusal(base_env, ["MLPERF_ORG=acme"], MLPERF_DIVISION="open")
    assert "MLPERF_DIVISION, MLPERF_ORG" in text and f"Run {script}" in text
    assert "MLPERF_RUN" in _layer_refusal(base_env, MLPERF_RUN="{}")


def test_a_layer_variable_of_the_machine_is_a_notice(base_env):
    """A site may export MLPERF_CACHE_CLEAR_CMD for every job: the core launch says it does
    not use it, and runs."""
    result = resolve("llama3", dict(base_env, DRY_RUN="1", MLPERF_CACHE_CLEAR_CMD="true"))
    (notice,) = [n.message for n in result.settings.notices if n.guard == "layer_variables"]
    assert notice.startswith("MLPERF_CACHE_CLEAR_CMD is for ") and "does not use it" in notice


def test_an_empty_layer_variable_in_the_environment_is_unset(base_env):
    result = resolve("llama3", dict(base_env, DRY_RUN="1", MLPERF_DIVISION=""))
    assert result.ctx.layer_given == {}


def test_a_layer_that_runs_takes_its_own_variables(base_env):
    """The toy layer's prefix is no entry's; an entry's variables pass where its layer runs."""
    from training.launch.layers import LayerEntry, entry_elsewhere

    toggles = (Toggle("MLPERF_X", "str", None, LAUNCHER, "x"),)
    assert entry_elsewhere("MLPERF_DIVISION", toggles) is None
    assert isinstance(entry_elsewhere("MLPERF_DIVISION", ()), LayerEntry)
    assert entry_elsewhere("WIDGET", ()) is None


def test_every_layer_entry_names_its_scripts_and_covers_its_layers_variables():
    """ENTRIES is data in the core (which imports no family): each layer's toggles, and the
    variable its launch exports to the run, are covered by its entry, whose scripts run the
    layer's launcher; no core toggle is covered by any entry."""
    import re

    from training.launch.layers import ENTRIES
    from training.launch.toggles import REGISTRY
    from training.mlperf import launch as mlperf_launch
    from training.mlperf.layer import TOGGLES as MLPERF
    from training.moe.layer import TOGGLES as MOE

    entries = {e.prefix: e for e in ENTRIES}
    for prefix, toggles, module, extra in (("MLPERF_", MLPERF, "training.mlperf.launch",
                                            [mlperf_launch.RUN_ENV]),
                                           ("MOE_", MOE, "training.moe.launch", [])):
        entry = entries[prefix]
        scripts = re.findall(r"examples/\S+\.sh", entry.script)
        assert scripts and all(module in (REPO / s).read_text() for s in scripts), entry.script
        names = [t.name for t in toggles] + extra
        assert all(entry.covers(n) for n in names), [n for n in names if not entry.covers(n)]
        assert set(entry.machine) <= set(names)
    assert not [t.name for t in REGISTRY for e in ENTRIES if e.covers(t.name)]


def test_moe_variables_on_the_llama_launch_are_refused(base_env):
    """EP=8 with train_llama3.sh was silently ignored (the MoE layer runs only under
    examples/moe/): refused, naming those scripts."""
    text = _layer_refusal(base_env, ["MOE_GROUPED_GEMM=0"], EP="8")
    assert "EP, MOE_GROUPED_GEMM" in text and "train_qwen3_moe.sh" in text
