"""The masking rules of training/credentials.py stated over their classes, not one example each
(issue 55: a one-line change to the masking survived tests that checked one value):

  every credential word, in every position of a name it counts in, makes the name a secret;
    the training words (TOKEN, KEY, ...) only as the last part; the registry's knobs never;
  every provider's token shape (written out here from the providers' own formats, not from
    the module's patterns) is masked wherever a value is shown: alone, as NAME=value, after a
    --flag, quoted, in a URL's query, in a URL's user:password@;
  and what is masked is exactly the secret (the text around it is kept).
"""
from __future__ import annotations

import itertools
import random
import string

import pytest
from hypothesis import given, settings   # pyproject's dev extra
from hypothesis import strategies as st

from training import credentials as cred
from training.credentials import MASK, carries_credentials, is_secret, mask_text, mask_value, shown


def _fill(alphabet: str, n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits
B64URL = ALNUM + "_-"

# One token of each shape a provider issues (prefix + the length and alphabet they document).
PROVIDER_SAMPLES = {
    "Hugging Face user token": "hf_" + _fill(ALNUM, 34, 1),
    "Hugging Face org token": "api_org_" + _fill(ALNUM, 34, 2),
    "GitHub classic PAT": "ghp_" + _fill(ALNUM, 36, 3),
    "GitHub OAuth": "gho_" + _fill(ALNUM, 36, 4),
    "GitHub user-to-server": "ghu_" + _fill(ALNUM, 36, 5),
    "GitHub server-to-server": "ghs_" + _fill(ALNUM, 36, 6),
    "GitHub refresh": "ghr_" + _fill(ALNUM, 36, 7),
    "GitHub fine-grained PAT": "github_pat_" + _fill(ALNUM, 22, 8) + "_" + _fill(ALNUM, 59, 9),
    "GitLab PAT": "glpat-" + _fill(B64URL, 20, 10),
    "GitLab deploy token": "gldt-" + _fill(B64URL, 20, 11),
    "GitLab runner token": "glrt-" + _fill(B64URL, 20, 12),
    "OpenAI key": "sk-" + _fill(ALNUM, 48, 13),
    "OpenAI project key": "sk-proj-" + _fill(B64URL, 64, 14),
    "Anthropic key": "sk-ant-api03-" + _fill(B64URL, 80, 15),
    "Stripe secret key": "sk_live_" + _fill(ALNUM, 24, 16),
    "Stripe restricted key": "rk_live_" + _fill(ALNUM, 24, 17),
    "Stripe test key": "sk_test_" + _fill(ALNUM, 24, 18),
    "AWS access key id": "AKIA" + _fill(UPPER, 16, 19),
    "AWS temporary access key id": "ASIA" + _fill(UPPER, 16, 20),
    "Google API key": "AIza" + _fill(B64URL, 35, 21),
    "Slack bot token": "xoxb-" + _fill(string.digits, 12, 22) + "-" + _fill(ALNUM, 24, 23),
    "Slack user token": "xoxp-" + _fill(string.digits, 12, 24) + "-" + _fill(ALNUM, 32, 25),
    "Slack app token": "xapp-1-" + _fill(ALNUM, 40, 26),
    "Slack refresh token": "xoxe-1-" + _fill(ALNUM, 40, 27),
    "npm token": "npm_" + _fill(ALNUM, 36, 28),
    "PyPI token": "pypi-AgEIcHlwaS5vcmc" + _fill(B64URL, 60, 29),
    "Docker Hub PAT": "dckr_pat_" + _fill(B64URL, 27, 30),
    "NVIDIA NGC API key": "nvapi-" + _fill(B64URL, 64, 31),
    "Databricks token": "dapi" + _fill("0123456789abcdef", 32, 32),
    "Replicate token": "r8_" + _fill(ALNUM, 37, 33),
    "Groq key": "gsk_" + _fill(ALNUM, 52, 34),
}

# Every place a value is shown; {v} is the value. The name is one that is NOT a secret (the
# value alone must be recognised).
CONTEXTS = ("{v}", "MODEL_NOTE={v}", "MODEL_NOTE='{v}'", 'MODEL_NOTE="{v}"', "--model-note {v}",
            "--model-note={v}", "https://example.com/x?foo=1&bar={v}", "error: bad value {v}: use x",
            "[{v}]", "({v})", "x,{v},y")


@pytest.mark.parametrize("provider", sorted(PROVIDER_SAMPLES))
def test_every_provider_token_is_a_credential(provider):
    token = PROVIDER_SAMPLES[provider]
    assert carries_credentials(token), provider
    assert mask_value(token) == MASK, provider
    assert shown("MODEL_NOTE", token) == MASK


@pytest.mark.parametrize("provider", sorted(PROVIDER_SAMPLES))
@pytest.mark.parametrize("context", CONTEXTS)
def test_every_provider_token_is_masked_wherever_a_value_is_shown(provider, context):
    token = PROVIDER_SAMPLES[provider]
    text = context.format(v=token)
    masked = mask_text(text)
    assert token not in masked and token[8:] not in masked, masked
    assert masked == context.format(v=MASK), "only the secret is masked, the rest kept"


def test_the_module_names_each_provider_it_masks():
    """Each provider pattern of the module is exercised by a sample above (a pattern without
    one would be a rule nobody checks)."""
    import re

    for provider, pattern in cred.PROVIDER_TOKENS.items():
        assert any(re.fullmatch(pattern, t) for t in PROVIDER_SAMPLES.values()), provider


@pytest.mark.parametrize("provider", sorted(cred.PROVIDER_TOKENS))
@settings(max_examples=25, deadline=None, database=None)
@given(data=st.data())
def test_any_token_of_a_provider_shape_is_masked_in_a_line(provider, data):
    """Generated from the shape: any spelling of it (any length the shape allows) is masked
    inside a line, with the words around it kept."""
    token = data.draw(st.from_regex(cred.PROVIDER_TOKENS[provider], fullmatch=True))
    line = f"run with MODEL_NOTE={token} now"
    assert mask_text(line) == f"run with MODEL_NOTE={MASK} now"


# -- names ---------------------------------------------------------------------------------------

# The rule's words, as the module's docstring states them (written out: a word dropped from the
# module is then a failing case, not a case less).
EXACT = ("SECRET", "SECRETS", "PASS", "PASSWD", "PASSWORD", "PASSWORDS", "PASSPHRASE",
         "CREDENTIAL", "CREDENTIALS", "CRED", "CREDS", "COOKIE", "SIGNATURE", "PRIVATE", "APIKEY")
LAST_ONLY = ("TOKEN", "TOKENS", "KEY", "KEYS", "PAT", "AUTH", "SESSION")
ENDINGS = ("TOKEN", "TOKENS", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIALS",
           "ACCESSKEY")
PLAIN = ("MODEL", "DATA", "NCCL", "HF", "MY")


@pytest.mark.parametrize("word", EXACT)
def test_a_credential_word_in_any_position_makes_a_secret(word):
    for before, after in itertools.product(("", "MY_", "A_B_"), ("", "_FILE", "_X_Y")):
        for name in (f"{before}{word}{after}", f"{before}{word}{after}".lower(),
                     "--" + f"{before}{word}{after}".lower().replace("_", "-")):
            assert is_secret(name), name


@pytest.mark.parametrize("word", LAST_ONLY)
def test_a_training_word_is_a_secret_only_as_the_last_part(word):
    for head in PLAIN:
        assert is_secret(f"{head}_{word}"), f"{head}_{word}"
        assert is_secret(f"--{head}-{word}".lower())
        assert not is_secret(f"{head}_{word}_DISPATCHER"), f"{head}_{word}_DISPATCHER"
        assert not is_secret(f"{word}_{head}"), f"{word}_{head}"


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_name_ending_in_a_long_credential_word_is_a_secret(ending):
    for head in ("MY", "HF", "X"):
        assert is_secret(f"{head}{ending}"), f"{head}{ending}"
        assert is_secret(f"A_{head}{ending}_FILE"), f"A_{head}{ending}_FILE"


def test_no_knob_of_the_registry_or_its_flags_is_masked():
    """A training knob masked as a secret hides what was trained from the table."""
    from training.launch.toggles import REGISTRY

    names = [t.name for t in REGISTRY] + [f for t in REGISTRY for f in t.megatron_flags]
    assert [n for n in names if is_secret(n)] == []


@pytest.mark.parametrize("name", sorted({*EXACT, "PWD_SECRET", *(f"HF_{w}" for w in LAST_ONLY)}))
def test_a_secret_named_value_is_masked_in_every_spelling_of_an_assignment(name):
    value = "v4lue-" + _fill(ALNUM, 6, 40)
    for text in (f"{name}={value}", f"{name}='{value}'", f'{name}="{value}"',
                 f"--{name.lower().replace('_', '-')} {value}", f"--{name.lower().replace('_', '-')}={value}"):
        assert value not in mask_text(text), text
    assert shown(name, value) == MASK


@pytest.mark.parametrize("scheme", ["https", "http", "s3", "redis", "postgresql", "git+ssh"])
def test_a_password_in_any_url_is_masked_and_the_host_kept(scheme):
    url = f"{scheme}://alice:pa55-w0rd@host.example:5432/db"
    assert mask_value(url) == f"{scheme}://alice:{MASK}@host.example:5432/db"
    assert "pa55-w0rd" not in mask_text(f"DATA_URL={url}")


@pytest.mark.parametrize("param", ["token", "access_token", "api_key", "apikey", "key", "password",
                                   "passwd", "pass", "secret", "client_secret", "sig", "signature",
                                   "auth", "credential", "pat", "X-Amz-Signature"])
def test_a_credential_query_parameter_is_masked(param):
    for sep in ("?", "&", ";"):
        url = f"https://h/p?a=1{sep if sep != '?' else '&'}{param}=s3cr3tvalue&b=2"
        assert "s3cr3tvalue" not in mask_value(url), url
        assert mask_value(url).endswith("&b=2")
