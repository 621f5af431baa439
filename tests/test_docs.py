"""Docs that run: every shell block of README.md and docs/*.md is run or resolved here.

A shell block (fenced `bash`/`sh`/`console`, or an indented block that starts with a command)
carries a marker on the line before it, `<!-- docs-test: MODE -->`:

  run      executed as written, on the CPU, in a sandbox that looks like the repository (its
           folders linked, a fresh experiment/, the tiny data at data/shakespeare/); exit 0
  gpu      needs what the test machine lacks (GPUs, a cluster, the network, a model's files):
  cluster  each launch of an example script in it is resolved with DRY_RUN=1 as on an 8-GPU
           H200 node (exit 0: every toggle, value and rule holds), each
           `python -m MODULE [COMMAND] --flags` names a module, command and flags that exist,
           each `make TARGET` a Makefile target, each repository path a file
  usage    a synopsis: the module, command and --flags exist

A block without a marker fails, so a new command in the docs is either run or resolved; a
renamed flag, toggle, module or script breaks this test.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MODES = ("run", "gpu", "cluster", "usage")
MARKER = re.compile(r"<!-- docs-test: (\w+) -->")
SHELL_LANGS = ("bash", "sh", "shell", "console")
# the first word of an indented block that makes it a shell block
COMMANDS = ("python", "python3", "bash", "make", "sbatch", "srun", "docker", "torchrun", "pip",
            "cd", "export", "git", "kill", "pkill", "nvidia-smi", "rocm-smi")
ASSIGN = re.compile(r"^[A-Z_][A-Z0-9_]*=")
# a gpu/cluster block's launch is resolved as on an 8-GPU H200 node (unless it says otherwise)
GPU_NODE = {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "PREFLIGHT_MEMORY": "warn"}
# the guards that refuse a launch for a file the page's machine has and this one lacks
FILES_ELSEWHERE = {"data_path", "pretrained_checkpoint"}


def _is_command(line: str) -> bool:
    words = line.split()
    while words and ASSIGN.match(words[0]):
        words = words[1:]
    return bool(words) and words[0] in COMMANDS


def blocks(page: Path) -> list[tuple[int, str | None, str]]:
    """(line number, marker, text) of every shell block of a page."""
    lines = page.read_text().splitlines()
    found, i = [], 0

    def marker(at: int) -> str | None:
        j = at - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        m = MARKER.search(lines[j]) if j >= 0 else None
        return m.group(1) if m else None

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang = line[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if lang in SHELL_LANGS:
                found.append((i + 1, marker(i), "\n".join(lines[i + 1:j])))
            i = j + 1
            continue
        if line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            text = "\n".join(x[4:] for x in lines[i:j]).strip()
            first = commands(text)
            if first and _is_command(first[0]):
                found.append((i + 1, marker(i), text))
            i = j
            continue
        i += 1
    return found


def commands(text: str) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        line = line.rstrip()
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        out.append(re.sub(r"\s+#.*$", "", current).strip())
        current = ""
    return [c for c in out if c]


ALL = [(page, n, mode, text) for page in PAGES for n, mode, text in blocks(page)]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """A folder that looks like the repository: its folders linked, the tiny data made."""
    root = tmp_path_factory.mktemp("docs")
    for entry in REPO.iterdir():
        if entry.name not in ("experiment", "data") and not entry.name.startswith("."):
            (root / entry.name).symlink_to(entry)
    sys.path.insert(0, str(REPO))
    from tests.mlperf.datasets import make_datasets

    (root / "data" / "shakespeare").mkdir(parents=True)
    make_datasets(root / "data" / "shakespeare")
    return root


def _env(sandbox: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VERBOSE", "COLUMNS")}
    env.update(PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", PYTHON=sys.executable,
               PYTHONPATH=str(sandbox), HF_HUB_OFFLINE="1", QUIET="1", **extra)
    return env


def _module_source(module: str) -> str | None:
    """The source text of a module's package (a command may take its parser from a sibling)."""
    spec = importlib.util.find_spec(module.split()[0]) if module.startswith("training") else None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin)
    return "\n".join(f.read_text() for f in sorted(path.parent.glob("*.py")))


def _check_python(words: list[str], where: str) -> None:
    module = words[words.index("-m") + 1]
    if not module.startswith("training"):   # another package's tool (pip, mlperf_logging)
        assert importlib.util.find_spec(module.split(".")[0]) is not None, f"{where}: {module}"
        return
    source = _module_source(module)
    assert source is not None, f"{where}: no module {module}"
    rest = words[words.index("-m") + 2:]
    if rest and re.fullmatch(r"[a-z][a-z-]+", rest[0]):   # a command of the module's
        assert f'"{rest[0]}"' in source, f"{where}: {module} has no command {rest[0]}"
    for word in rest:
        flag = word.strip("[]|").split("=")[0]
        if flag.startswith("--") and len(flag) > 2:
            assert f'"{flag}"' in source, f"{where}: {module} has no flag {flag}"


def _resolve(command: str, sandbox: Path, where: str) -> None:
    """A command that needs GPUs, a cluster or data we lack: what can be checked, is."""
    words = shlex.split(re.sub(r"<[^>]*>", "PLACEHOLDER", command))
    env_words = {}
    while words and ASSIGN.match(words[0]):
        key, value = words.pop(0).split("=", 1)
        env_words[key] = value
    if not words:
        return
    if words[0] == "make":
        targets = re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.M)
        assert all(t in targets for t in words[1:] if not ASSIGN.match(t)), where
        return
    if words[0].startswith("python") and "-m" in words:
        _check_python(words, where)
        return
    for word in words:
        if re.match(r"(examples|launchers|docker|training|docs|tests)/", word):
            assert (REPO / word).exists(), f"{where}: {word} does not exist"
    script = next((w for w in words if re.match(r"examples/.*/train_.*\.sh$", w)), None)
    if script is None or "$" in command:
        return
    args = words[words.index(script) + 1:]
    proc = subprocess.run(["bash", script, *args], cwd=sandbox, capture_output=True, text=True,
                          env=_env(sandbox, **{**GPU_NODE, **env_words, "DRY_RUN": "1"}),
                          timeout=300)
    refused = set(re.findall(r"^(?:error: )?\[(\w+)\]", proc.stderr, re.M))
    if proc.returncode == 2 and refused and refused <= FILES_ELSEWHERE:
        return   # resolved; only the files the page's machine has are missing here
    elsewhere = [value for value in (*env_words.values(), *(a.split("=", 1)[-1] for a in args))
                 if "/" in value and not (sandbox / value).exists()]
    if proc.returncode == 2 and any(f"{path}: no such file" in proc.stderr for path in elsewhere):
        return   # a model folder or checkpoint of the page's machine
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stderr[-2000:]}"


def test_every_shell_block_is_marked():
    unmarked = [f"{p.relative_to(REPO)}:{n}" for p, n, mode, _ in ALL if mode not in MODES]
    assert not unmarked, ("mark each with <!-- docs-test: run|gpu|cluster|usage --> on the line "
                          "before it: " + ", ".join(unmarked))
    assert len(ALL) >= 30


@pytest.mark.parametrize("page,line,mode,text", [a for a in ALL if a[2] in MODES],
                         ids=[f"{p.name}:{n}" for p, n, m, _ in ALL if m in MODES])
def test_the_block_runs_or_resolves(sandbox, page, line, mode, text):
    where = f"{page.relative_to(REPO)}:{line}"
    if mode == "run":
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=sandbox,
                              capture_output=True, text=True, env=_env(sandbox), timeout=300)
        assert proc.returncode == 0, f"{where}\n{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}"
        return
    for command in commands(text):
        if mode == "usage":
            words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
            if "-m" in words:
                _check_python(words, where)
            continue
        _resolve(command, sandbox, where)


def test_a_renamed_flag_breaks_it(sandbox):
    with pytest.raises(AssertionError, match="no flag --no-such-flag"):
        _resolve("python -m training.optimize RUN --no-such-flag", sandbox, "x")
    with pytest.raises(AssertionError, match="NO_SUCH_TOGGLE|exit|error"):
        _resolve("bash examples/llama/train_llama3.sh TP=three", sandbox, "x")
