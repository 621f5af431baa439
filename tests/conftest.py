"""Shared test setup: CPU only, GPU tests skipped with a reason."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def pytest_collection_modifyitems(config, items):
    # the long tests first (stable: file order otherwise), so that parallel workers
    # (`make test`: pytest-xdist) do not end on one long test while the other waits
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def verbose_launch(monkeypatch):
    """Launches in tests print the full table and the buckets by name (VERBOSE=1), what most
    tests read; tests/launch/test_summary.py tests the default one-screen summary. The
    caller's COLUMNS does not reach them (pytest-xdist's workers set 80): the table's layout is
    the same in one process or several."""
    monkeypatch.setenv("VERBOSE", "1")
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(autouse=True)
def fresh_moe_metrics():
    """Megatron's MoE metrics tracker is process-global and sizes each metric for the first
    model that records it: a later test's model with more layers would index past it. Each test
    starts without entries (only where Megatron's MoE logging is already imported)."""
    logging_module = sys.modules.get("megatron.core.transformer.moe.moe_logging")
    if logging_module is not None:
        logging_module.get_moe_metrics_tracker()._metrics.clear()   # no public reset in 0.19.2


@pytest.fixture
def base_env(tmp_path):
    """A minimal environment for resolve(): no user toggles, runs under tmp_path."""
    return {"EXPERIMENT_DIR": str(tmp_path / "experiment"), "PATH": os.environ.get("PATH", ""),
            "VERBOSE": "1"}
