"""What is a secret, decided once: by a variable's name, and by what a value carries.

A name is a secret when one of its parts (split at "_" or "-") is a credential word:
SECRET(S), PASS, PASSWD, PASSWORD, PASSPHRASE, PWD, CREDENTIAL(S), CRED(S), COOKIE,
SIGNATURE, PRIVATE, or ends with one of the long ones (HFTOKEN, APIKEY); the words that also
name training things, TOKEN(S), KEY(S), PAT, AUTH and SESSION, count as its last part only.
So HF_TOKEN, WANDB_API_KEY, DB_PASS, API_KEYS, GITHUB_PAT, SSH_PASSPHRASE are;
TOKENIZER_MODEL, MOE_TOKEN_DISPATCHER (--moe-token-dispatcher-type), DATA_PATH and PWD (the
shell's folder) are not.

A value carries a credential when it holds a URL's `user:password@`, a bare
`user:password@host`, a query parameter such as `?token=...` / `&key=...`, or a token with a
well-known prefix (every provider of PROVIDER_TOKENS: hf_..., ghp_..., glpat-..., sk-..., AKIA...,
AIza..., xoxb-..., nvapi-...).

Everything that renders a value (the launch table, manifest.json, the docker/srun/torchrun
lines, error messages) goes through `shown` or `mask_text`; everything that hands a value to
another process passes a secret through the environment, never on a command line
(`secret_pair`). Standard library only (the docker and Slurm hosts may have no project
environment).
"""
from __future__ import annotations

import re

MASK = "****"

_EXACT = frozenset({
    "SECRET", "SECRETS", "PASS", "PASSWD", "PASSWORD", "PASSWORDS", "PASSPHRASE", "PWD",
    "CREDENTIAL", "CREDENTIALS", "CRED", "CREDS", "COOKIE", "SIGNATURE", "APIKEY", "PRIVATE"})
# Credential words that also name training things (MOE_TOKEN_DISPATCHER, a key-value cache):
# a secret only as the name's last part (HF_TOKEN, WANDB_API_KEY, GITHUB_PAT).
_LAST = frozenset({"TOKEN", "TOKENS", "KEY", "KEYS", "PAT", "AUTH", "SESSION"})
_ENDINGS = ("TOKEN", "TOKENS", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE",
            "CREDENTIALS", "ACCESSKEY")
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})

# A URL's user:password@ (the password group is masked), a bare user:password@host, a query
# parameter that names a credential, tokens with a well-known prefix.
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'\"]*:)(?P<secret>[^\s/@'\"]+)(?=@)")
_BARE_USERINFO = re.compile(r"(?P<head>(?:^|(?<=[\s='\"/]))[A-Za-z0-9._~-]+:)(?P<secret>[^\s/:@'\"]+)(?=@[A-Za-z0-9\[])")
_QUERY = re.compile(r"(?P<head>[?&;](?:[A-Za-z_-]*(?:token|key|password|passwd|pass|secret|sig|"
                    r"signature|auth|credential|pat))=)(?P<secret>[^&\s'\"#]+)", re.IGNORECASE)
# Each provider's published token shape (PROVIDER_TOKENS names them; tests/launch/
# test_secret_rules.py generates one of each and checks every place a value is shown).
PROVIDER_TOKENS = {
    "Hugging Face": r"hf_[A-Za-z0-9]{16,}|api_org_[A-Za-z0-9]{16,}",
    "GitHub": r"gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}",
    "GitLab": r"gl(?:pat|dt|rt|ptt|soat|cbt|ffct)-[A-Za-z0-9_-]{16,}",
    "OpenAI / Anthropic / DeepSeek": r"sk-[A-Za-z0-9_-]{16,}",
    "Stripe": r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",
    "AWS access key": r"(?:AKIA|ASIA)[0-9A-Z]{16}",
    "Google API key": r"AIza[0-9A-Za-z_-]{35}",
    "Slack": r"xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}",
    "npm": r"npm_[A-Za-z0-9]{30,}",
    "PyPI": r"pypi-[A-Za-z0-9_-]{40,}",
    "Docker Hub": r"dckr_pat_[A-Za-z0-9_-]{20,}",
    "NVIDIA NGC": r"nvapi-[A-Za-z0-9_-]{40,}",
    "Databricks": r"dapi[0-9a-f]{32}",
    "Replicate": r"r8_[A-Za-z0-9]{30,}",
    "Groq": r"gsk_[A-Za-z0-9]{30,}",
}
_KNOWN_TOKENS = re.compile(r"(?P<head>)(?P<secret>(?<![A-Za-z0-9_-])(?:"
                           + "|".join(PROVIDER_TOKENS.values()) + "))")
_VALUE_PATTERNS = (_URL_USERINFO, _BARE_USERINFO, _QUERY, _KNOWN_TOKENS)
# NAME=value in a text (a shell line, a message); the value shell-quoted or one word.
_ASSIGNMENT = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?P<value>'[^']*'|\"[^\"]*\"|[^\s,;)'\"]*)")
# A placeholder in a message (KEY=VALUE, HF_TOKEN=...), not a value.
_PLACEHOLDER = re.compile(r"[A-Z_]+|\.\.\.|<[^>]*>|\*+")
# --some-token VALUE / --some-token=VALUE on a command line.
_FLAG = re.compile(r"(?P<flag>--[A-Za-z0-9-]+)(?P<sep>[ =])(?P<value>'[^']*'|\"[^\"]*\"|[^\s]+)")


def is_secret(name: str) -> bool:
    """Whether a variable's (or a --flag's) value must never be printed, recorded or put on a
    command line: a part of its name is a credential word."""
    upper = name.upper().lstrip("-")
    if upper in _NOT_SECRET:
        return False
    parts = [p for p in re.split(r"[_\-]", upper) if p]
    return bool(parts) and (parts[-1] in _LAST
                            or any(p in _EXACT or (p.endswith(_ENDINGS) and p not in _LAST)
                                   for p in parts))


def carries_credentials(value: str) -> bool:
    """Whether a value holds a password, token or key inside it (a URL's user:password@, ...)."""
    return any(p.search(value) for p in _VALUE_PATTERNS)


def secret_pair(name: str, value: str) -> bool:
    """A variable that must travel by environment and be masked wherever shown."""
    return is_secret(name) or carries_credentials(value)


def mask_value(value: str) -> str:
    """The value with the credentials inside it masked (user:****@host, ?token=****)."""
    for pattern in _VALUE_PATTERNS:
        value = pattern.sub(lambda m: m.group("head") + MASK, value)
    return value


def shown(name: str, value: str) -> str:
    """A variable's value as tables, manifest.json and messages show it."""
    if is_secret(name) and value:
        return MASK
    return mask_value(value)


def mask_text(text: str) -> str:
    """A line for a human or a file (an error message, a shell line): every secret-named
    NAME=value and --secret-flag value masked, and every credential inside a value."""
    def assignment(m: re.Match) -> str:
        value = m.group("value")
        if not is_secret(m.group("name")) or not value or _PLACEHOLDER.fullmatch(value):
            return m.group(0)
        return f"{m.group('name')}={MASK}"

    def flag(m: re.Match) -> str:
        return f"{m.group('flag')}{m.group('sep')}{MASK}" if is_secret(m.group("flag")) \
            and not m.group("value").startswith("--") else m.group(0)

    return mask_value(_FLAG.sub(flag, _ASSIGNMENT.sub(assignment, text)))
