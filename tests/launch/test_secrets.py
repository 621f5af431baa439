"""Secrets (training/credentials.py: a credential word in the name, or a credential inside the
value) are masked in the table and manifest.json and still reach the run (issues 20, 38)."""
from __future__ import annotations

import io
import json

import pytest

from training.launch.__main__ import shell_assignments
from training.launch.environment import MASK, is_secret
from training.credentials import carries_credentials, mask_text, mask_value, shown
from training.launch.manifest import launch_manifest
from training.launch.report import print_report

from .helpers import launch


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                  "DB_PASSWORD", "NCCL_IB_SECRET", "HSA_TOOLS_KEY",
                                  "HUGGING_FACE_HUB_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS",
                                  "DB_PASS", "API_KEYS", "GITHUB_PAT", "PASSPHRASE", "SMTP_PASSWD",
                                  "SLACK_AUTH", "NPM_CREDENTIAL", "MYAPIKEY", "HFTOKEN"])
def test_secret_names(name):
    assert is_secret(name)


@pytest.mark.parametrize("name", ["TOKENIZER_MODEL", "TOKENIZERS_PARALLELISM", "NCCL_DEBUG",
                                  "KEYBOARD_LAYOUT", "MASTER_ADDR", "HSA_NO_SCRATCH_RECLAIM",
                                  "PWD", "OLDPWD", "DATA_PATH", "COMPAT_MODE", "PATCH_LEVEL",
                                  # training words: a credential word only as the last part
                                  "MOE_TOKEN_DISPATCHER", "--moe-token-dispatcher-type",
                                  "MOE_TOKEN_DROP_POLICY", "KEY_VALUE_CACHE", "HF_TOKEN_PATH"])
def test_not_secret_names(name):
    assert not is_secret(name)


def test_the_moe_dispatcher_is_shown_in_the_torchrun_line():
    """MOE_TOKEN_DISPATCHER's value was masked as a credential (`****` in the copy-pasteable
    torchrun line and the manifest; session 14)."""
    line = "--moe-token-dispatcher-type alltoall --moe-token-drop-policy probs --hf-token abc"
    assert mask_text(line) == ("--moe-token-dispatcher-type alltoall --moe-token-drop-policy "
                               "probs --hf-token ****")
    assert shown("MOE_TOKEN_DISPATCHER", "alltoall") == "alltoall"


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


@pytest.mark.parametrize("value, masked", [
    ("admin:pw1@10.0.0.1", "admin:****@10.0.0.1"),
    ("https://user:pw1@hub.example/m", "https://user:****@hub.example/m"),
    ("s3://b/x?token=pw1&part=2", "s3://b/x?token=****&part=2"),
    ("https://x/y?X-Api-Key=pw1", "https://x/y?X-Api-Key=****"),
    ("hf_abcdefghijklmnopqrstuvwx", "****"),
])
def test_a_credential_inside_a_value_is_masked(value, masked):
    assert carries_credentials(value) and mask_value(value) == masked
    assert shown("PLAIN_NAME", value) == masked


@pytest.mark.parametrize("value", ["node0", "10.0.0.1", "git@github.com:org/repo", "/data/ds_text",
                                   "http://node0:29500", "meta-llama/Llama-3.1-8B"])
def test_a_plain_value_is_shown_as_is(value):
    assert not carries_credentials(value) and shown("PLAIN_NAME", value) == value


def test_a_text_is_masked_word_by_word_and_placeholders_stay():
    text = ("docker run -e 'HF_TOKEN=abc' DB_PASS='a b' --hf-token zz --tokenizer-model "
            "https://u:pw@h/m use KEY=VALUE or HF_TOKEN=...")
    assert mask_text(text) == ("docker run -e 'HF_TOKEN=****' DB_PASS=**** --hf-token **** "
                               "--tokenizer-model https://u:****@h/m use KEY=VALUE or HF_TOKEN=...")
