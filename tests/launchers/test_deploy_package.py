"""Deployment (training/deploy/: Slurm, docker, images, the GPU check) sits apart from the
resolver (training/launch/): it uses the resolver's public names only, and the resolver uses
nothing of it."""
from __future__ import annotations

import ast
from pathlib import Path

from .conftest import REPO


def _from_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or "", [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name, []


def test_deployment_uses_only_the_resolvers_public_names():
    files = sorted((REPO / "training" / "deploy").glob("*.py"))
    assert {p.stem for p in files} >= {"cluster", "docker", "image", "gpu_check"}
    for path in files:
        for level, module, names in _from_imports(path):
            assert level == 0 or not module.startswith(("launch", "guards", "settings")), path
            if module.startswith("training.launch"):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{path.name} imports {private} from {module}"


def test_the_resolver_uses_nothing_of_deployment():
    for path in (REPO / "training" / "launch").glob("*.py"):
        for _level, module, _names in _from_imports(path):
            assert "deploy" not in module.split("."), f"{path.name} imports {module}"
