"""The micro-batch the pre-flight chooses (training/optimize/microbatch.py): where nobody set
MBS, the largest micro-batch docs/levers.json measured faster (this GPU, backend, precision,
kind of model; at least MIN_GAIN) that fits the memory estimate and divides the global batch,
shown with source `preflight` and the row; a user's, a recipe's MBS never touched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import training.moe.launch  # noqa: F401 - registers the MoE families
from training.launch.resolve import resolve
from training.moe.gpt_oss import GPT_OSS
from training.moe.layer import MOE
from training.optimize import levers, microbatch
from training.optimize.config import device_gib
from training.optimize.memory import MEMORY_BOUND_FRACTION, estimate
from training.optimize.preflight import CHOOSERS
from training.run_description import RunDescription

from tests.mlperf.conftest import mlperf_data, mlperf_env  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]
H200 = {"PLATFORM": "h200", "GPUS_PER_NODE": "1", "BS": "8", "DRY_RUN": "1"}
LAYERS = {"qwen3_moe": [MOE], "mixtral": [MOE], "gpt_oss": [MOE, GPT_OSS], "llama3": []}


def run(base_env, family="qwen3_moe", words=(), choosers=CHOOSERS, **toggles):
    env = {**base_env, **H200, **{k: str(v) for k, v in toggles.items()}}
    return resolve(family, env, list(words), LAYERS[family], choosers=choosers)


def mbs(launch):
    setting = launch.settings.setting("MBS")
    return setting.value, setting.source


def notes(launch):
    return [n.message for n in launch.settings.notices if n.guard == microbatch.GUARD]


def _peak(launch, m):
    r = launch.run
    return estimate(RunDescription(r.family, r.model, {**r.values, "MBS": m}, r.platform,
                                   r.capabilities)).peak_gib


def _book(tmp_path, rows):
    """A levers file of MBS rows [(mbs, ratio, backend, model)] on the H200."""
    entries = [{"id": "MBS", "kind": "mbs", "set": f"MBS={m}", "baseline": "MBS=1",
                "effect": {"tokens_per_s_ratio": ratio, "verdict": "faster"},
                "shape": {"model": model, "num_layers": 8, "seq_length": 4096, "mbs": 1,
                          "global_batch": 8, "gpus": 1, "precision": "bf16",
                          "backend": backend},
                "hardware": "NVIDIA H200", "source": "test", "repeats": 2, "notes": ""}
               for m, ratio, backend, model in rows]
    path = tmp_path / "levers.json"
    path.write_text(json.dumps({"schema": 1, "levers": entries}))
    return levers.load(path)


@pytest.mark.parametrize("family, layers, model", [("qwen3_moe", 8, "qwen3-30B-A3B"),
                                                   ("mixtral", 4, "mixtral-8x7B"),
                                                   ("gpt_oss", 8, "gpt-oss-20b")])
def test_moe_on_the_h200_gets_its_measured_faster_micro_batch(base_env, tmp_path, monkeypatch,
                                                              family, layers, model):
    """Each MoE family, native backend on the H200, with a row of its own model: MBS 2,
    source preflight, the reason naming the row and the estimate; Megatron's words and the
    run folder's name carry it; the memory check is at MBS 2. docs/levers.json's own rows are
    Qwen3's: they choose for Qwen3 only."""
    measured = any(e.id == "MBS" and e.shape.get("model") == model
                   for e in levers.load_default(None, REPO).entries)
    assert measured is (family == "qwen3_moe")
    if family == "qwen3_moe":
        launch = run(base_env, family, NUM_LAYERS=layers)
        ratio = "1.12x"
    else:
        assert mbs(run(base_env, family, NUM_LAYERS=layers)) == (1, "default")
        book = _book(tmp_path, [(2, 1.2, "native", model)])
        monkeypatch.setattr(levers, "load_default", lambda *a: book)
        launch = run(base_env, family, NUM_LAYERS=layers)
        ratio = "1.20x"
    assert mbs(launch) == (2, "preflight")
    reason = launch.settings.setting("MBS").reason
    assert f"MBS=2 measured {ratio} MBS=1 on NVIDIA H200" in reason
    assert "estimated peak" in reason
    words = launch.buckets["TRAIN_ARGS"]
    assert words[words.index("--micro-batch-size") + 1] == "2"
    assert launch.run.layout.mbs == 2 and launch.run.layout.microbatches == 4
    assert "mbs2" in launch.log_dir.name or "mbs2" in str(launch.log_dir)
    assert _peak(launch, 2) <= MEMORY_BOUND_FRACTION * device_gib(launch.run)


def test_without_the_chooser_the_launch_is_as_before(base_env):
    assert mbs(run(base_env, NUM_LAYERS=8, choosers=())) == (1, "default")


@pytest.mark.parametrize("family, size", [("qwen3_moe", "tiny"), ("mixtral", "tiny"),
                                          ("gpt_oss", "tiny")])
def test_another_model_of_the_kind_is_not_spoken_for(base_env, family, size):
    """The tiny MoE presets (the GPU tests' runs) are no Qwen3-30B-A3B: no row, MBS 1."""
    assert mbs(run(base_env, family, MODEL_SIZE=size)) == (1, "default")


def test_dense_keeps_one_where_the_gain_is_noise(base_env):
    """Llama 3 8B's MBS 2 row is 1.011x: below MIN_GAIN, the micro-batch stays 1."""
    book = levers.load_default(None, REPO)
    dense = [e for e in book.entries if e.id == "MBS" and e.shape.get("model") == "llama3-8B"]
    assert dense and all(e.ratio < microbatch.MIN_GAIN for e in dense)
    for layers in (2, 8, 32):
        assert mbs(run(base_env, "llama3", NUM_LAYERS=layers)) == (1, "default")


@pytest.mark.parametrize("how", [{"env": "1"}, {"env": "4"}, {"word": "1"}, {"word": "3"}])
def test_a_users_micro_batch_is_never_touched(base_env, how):
    if "env" in how:
        launch = run(base_env, NUM_LAYERS=8, MBS=how["env"], BS=12)
        assert mbs(launch) == (int(how["env"]), "env")
    else:
        launch = run(base_env, words=[f"MBS={how['word']}"], NUM_LAYERS=8, BS=12)
        assert mbs(launch) == (int(how["word"]), "cli")
    assert not notes(launch)


def test_the_mlperf_recipe_keeps_its_reference_micro_batch(mlperf_env):
    from training.mlperf.launch import resolve_mlperf

    launch, _recipe, _config = resolve_mlperf({**mlperf_env, "PLATFORM": "h200",
                                               "GPUS_PER_NODE": "8"}, [])
    assert mbs(launch) == (1, "default")       # the reference's (Megatron's default)
    book = _book(Path(mlperf_env["EXPERIMENT_DIR"]).parent,
                 [(2, 1.5, launch.run.backend, launch.run.model.name)])
    assert microbatch.measured_faster(launch.run, book)      # a row that would apply ...
    assert microbatch.choose(launch, book) == {}              # ... and the recipe's stands


@pytest.mark.parametrize("platform", ["h100", "b300", "mi355x"])
def test_another_gpu_has_no_row_and_keeps_one(base_env, platform):
    """The rows are the H200's: elsewhere nothing is measured, nothing is chosen."""
    launch = run(base_env, NUM_LAYERS=4, PLATFORM=platform)
    assert mbs(launch) == (1, "default")


def test_the_te_backend_has_its_own_row(base_env):
    launch = run(base_env, NUM_LAYERS=8, TRANSFORMER_IMPL="transformer_engine")
    assert mbs(launch) == (2, "preflight")
    assert "1.43x" in launch.settings.setting("MBS").reason


def test_what_does_not_fit_gives_the_next_smaller(base_env, tmp_path, monkeypatch):
    """Rows for MBS 8, 4 and 2: at a depth where 8 and 4 do not fit the estimate and 2 does, 2
    is chosen; where even 2 does not fit, 1 stays with a line naming each estimate."""
    book = _book(tmp_path, [(8, 1.4, "native", "qwen3-30B-A3B"), (4, 1.3, "native",
                                                                   "qwen3-30B-A3B"),
                            (2, 1.2, "native", "qwen3-30B-A3B")])
    monkeypatch.setattr(levers, "load_default", lambda *a: book)
    found = {}
    for layers in range(8, 49, 4):
        first = run(base_env, NUM_LAYERS=layers, choosers=())
        device = device_gib(first.run)
        fits = [m for m in (8, 4, 2) if _peak(first, m) <= MEMORY_BOUND_FRACTION * device]
        found.setdefault(tuple(fits), (layers, first))
    assert (2,) in found and () in found, sorted(found)
    layers, _ = found[(2,)]
    assert mbs(run(base_env, NUM_LAYERS=layers)) == (2, "preflight")
    layers, _ = found[()]
    launch = run(base_env, NUM_LAYERS=layers, PREFLIGHT_MEMORY="warn")
    assert mbs(launch) == (1, "default")
    (note,) = notes(launch)
    assert all(f"MBS={m}'s estimated peak" in note for m in (8, 4, 2))


def test_the_global_batch_must_divide(base_env, tmp_path, monkeypatch):
    """BS=6 on one GPU: MBS 4 does not divide it, MBS 2 does; BS=9: neither, MBS stays 1
    with the reason; on 8 GPUs BS=8 leaves one sample a rank: 1."""
    book = _book(tmp_path, [(4, 1.3, "native", "qwen3-30B-A3B"),
                            (2, 1.2, "native", "qwen3-30B-A3B")])
    monkeypatch.setattr(levers, "load_default", lambda *a: book)
    assert mbs(run(base_env, NUM_LAYERS=4, BS=6)) == (2, "preflight")
    launch = run(base_env, NUM_LAYERS=4, BS=9)
    assert mbs(launch) == (1, "default")
    assert "MBS=4 does not divide the global batch 9" in notes(launch)[0]
    launch = run(base_env, NUM_LAYERS=4, BS=8, GPUS_PER_NODE=8, EP=8)
    assert mbs(launch) == (1, "default") and "over 8 data-parallel ranks" in notes(launch)[0]
    assert mbs(run(base_env, NUM_LAYERS=4, BS=32, GPUS_PER_NODE=8, EP=8)) == (4, "preflight")


def test_preflight_off_says_why_it_stays(base_env):
    launch = run(base_env, NUM_LAYERS=8, PREFLIGHT_MEMORY="off")
    assert mbs(launch) == (1, "default")
    assert "PREFLIGHT_MEMORY=off" in notes(launch)[0]


def test_entry_script_dry_run_shows_preflight_as_source(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
           "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1", "VERBOSE": "1",
           "PYTHON": sys.executable, **H200}
    proc = subprocess.run(["bash", str(REPO / "examples/moe/train_qwen3_moe.sh"),
                           "NUM_LAYERS=8"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cells = [[c.strip() for c in line.split("\u2502")[1:4]]
             for line in (proc.stdout + proc.stderr).splitlines() if line.count("\u2502") > 4]
    assert ["MBS", "2", "preflight"] in cells
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("torchrun ")]
    assert "--micro-batch-size 2" in line
