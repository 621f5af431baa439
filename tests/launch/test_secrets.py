"""Secrets (names with TOKEN, KEY, SECRET, PASSWORD) are masked in the table and manifest.json
and still reach the run (issue 20)."""
from __future__ import annotations

import io
import json

import pytest

from training.launch.__main__ import shell_assignments
from training.launch.environment import MASK, is_secret
from training.launch.manifest import launch_manifest
from training.launch.report import print_report

from .helpers import launch


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                  "DB_PASSWORD", "NCCL_IB_SECRET", "HSA_TOOLS_KEY",
                                  "HUGGING_FACE_HUB_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS"])
def test_secret_names(name):
    assert is_secret(name)


@pytest.mark.parametrize("name", ["TOKENIZER_MODEL", "TOKENIZERS_PARALLELISM", "NCCL_DEBUG",
                                  "KEYBOARD_LAYOUT", "MASTER_ADDR", "HSA_NO_SCRATCH_RECLAIM"])
def test_not_secret_names(name):
    assert not is_secret(name)


def test_secrets_are_masked_in_the_table_and_manifest_and_still_exported(base_env):
    env = dict(base_env, NCCL_IB_SECRET="ncclsecret1", HSA_TOOLS_KEY="hsakey2",
               NCCL_DEBUG="INFO")
    result = launch(env, words=["HF_TOKEN=hf_word3", "WANDB_API_KEY=wandb4"])
    out = io.StringIO()
    print_report(result, out)
    manifest = json.dumps(launch_manifest(result))
    for secret in ("ncclsecret1", "hsakey2", "hf_word3", "wandb4"):
        assert secret not in out.getvalue() and secret not in manifest
    assert out.getvalue().count(MASK) >= 4
    data = json.loads(manifest)
    assert data["environment"]["NCCL_IB_SECRET"]["value"] == MASK
    assert data["environment"]["NCCL_DEBUG"]["value"] == "INFO"
    assert data["passthrough_env"]["HF_TOKEN"] == MASK
    # the run itself gets the values
    text = shell_assignments(result)
    assert "export HF_TOKEN=hf_word3" in text and "export NCCL_IB_SECRET=ncclsecret1" in text
