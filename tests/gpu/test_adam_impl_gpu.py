"""ADAM_IMPL=native on a GPU where Transformer Engine imports: the native MixedPrecisionAdamW
in place of TE's FusedAdam under the MoE lean step's precision-aware optimizer. The tiny MoE
trains with it, the patch table says so, and a save at 10 resumed to 20 continues the
uninterrupted run (the Adam step restored from the param groups, where Megatron keeps it when
TE imports: a restarted step would reset Adam's bias correction, a percent-level drift)."""
from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None,
                                 reason="Transformer Engine is not installed")]

SCRIPT = "examples/moe/train_qwen3_moe.sh"


def _rows(run):
    manifest = json.loads((run / "manifest.json").read_text())
    return {row["toggle"]: row["value"] for row in manifest["toggles"]}


def _patches(run) -> list[str]:
    lines = [x for x in (run / "train.log").read_text().splitlines()
             if "megatron patches applied" in x]
    return [name.strip() for x in lines for name in x.split(":", 1)[1].split(",")]


@pytest.mark.parametrize("backend", ["native", "transformer_engine"])
def test_native_adam_in_place_of_te_trains_and_resumes(tmp_path, backend):
    from tests.gpu.test_train_gpu import _losses, _train

    ckpt = tmp_path / "ckpt"
    toggles = dict(TRANSFORMER_IMPL=backend, TOTAL_ITERS=20, ADAM_IMPL="native")
    full = _train(tmp_path, f"adam-full-{backend}", script=SCRIPT, SAVE=ckpt, SAVE_INTERVAL=10,
                  **toggles)
    rows = _rows(full)
    assert rows["ADAM_IMPL"] == "native"
    assert rows["MASTER_WEIGHTS"] != "fp32" or rows["ADAM_MOMENTS_DTYPE"] != "fp32"
    assert "native_adam_over_te" in _patches(full)
    resumed = _train(tmp_path, f"adam-resumed-{backend}", "--ckpt-step", "10", script=SCRIPT,
                     LOAD=ckpt, **toggles)
    a, b = _losses(full), _losses(resumed)
    assert sorted(a) == list(range(1, 21)) and sorted(b) == list(range(11, 21))
    worst = max(abs(a[i] - b[i]) / a[i] for i in range(11, 21))
    print(f"\nADAM_IMPL=native on {backend} with TE: loss {a[1]:.3f} -> {a[20]:.3f}; worst "
          f"relative difference after the resume {worst:.2e}")
    assert a[20] < a[1] - 0.5
    assert worst < 1e-3


def test_auto_keeps_te_fused_adam(tmp_path):
    from tests.gpu.test_train_gpu import _train

    run = _train(tmp_path, "adam-auto", script=SCRIPT, TRANSFORMER_IMPL="native", TOTAL_ITERS=5)
    assert "native_adam_over_te" not in _patches(run)
