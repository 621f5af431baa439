"""Fixtures for the MLPerf tests: small real indexed datasets (train + valid) and a tokenizer,
made at test time (nothing downloaded)."""
from __future__ import annotations

import os

import pytest

from .datasets import make_datasets, make_large_valid

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def mlperf_data(tmp_path_factory) -> dict[str, str]:
    """Small train/valid sets, the valid one replaced by one large enough for the closed
    division's evaluation (1024 sequences of 8192 tokens)."""
    root = tmp_path_factory.mktemp("mlperf_data")
    data = make_datasets(root)
    data["SMALL_VALID"] = data["VALID_DATA_PATH"]
    data["VALID_DATA_PATH"] = make_large_valid(root, data["TOKENIZER_MODEL"])
    return data


@pytest.fixture
def mlperf_env(tmp_path, mlperf_data) -> dict[str, str]:
    data = {k: v for k, v in mlperf_data.items() if k != "SMALL_VALID"}
    # MLPERF_CACHE_CLEAR_CMD: a harmless hook, so that no test drops this machine's page cache
    return {"EXPERIMENT_DIR": str(tmp_path / "experiment"), "PATH": os.environ.get("PATH", ""),
            "DRY_RUN": "1", "MLPERF_CACHE_CLEAR_CMD": "true", **data}
