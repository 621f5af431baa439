"""The floors of the tree, drawn from its imports: which part of training/ imports which.

    python -m training.floors            rewrite the generated block of docs/architecture.md
    python -m training.floors --check    exit 1 when that block is stale (a test runs it)

A part is a package of training/ (launch, deploy, mlperf, ...) or one of its top-level modules
(run_description, metrics, ...). Every import counts, at module level or inside a function
(a lazy import is still a dependency). Reads the files as text (ast): imports none of them.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from training.cli import ArgumentParser

TRAINING = Path(__file__).resolve().parent
DOC = TRAINING.parent / "docs" / "architecture.md"
BLOCK = re.compile(r"(<!-- floors:begin -->\n)(?:.*?\n)?(<!-- floors:end -->)", re.S)


def part_of(module: str) -> str | None:
    """training.launch.guards -> launch; training.metrics -> metrics; anything else -> None."""
    parts = module.split(".")
    if parts[0] != "training" or len(parts) < 2:
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(TRAINING.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> set[str]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from training import REPO_ROOT` names the package root itself; `from . import x`
            # may name a module
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def parts() -> set[str]:
    return {p.stem for p in TRAINING.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists())
            or (p.suffix == ".py" and p.stem != "__init__")}


def graph() -> dict[str, set[str]]:
    """part -> the other parts it imports (the package root's own __init__ left out)."""
    known = parts()
    edges: dict[str, set[str]] = {part: set() for part in known}
    for path in sorted(TRAINING.rglob("*.py")):
        own = part_of(_module_name(path))
        if own is None or "__pycache__" in path.parts:
            continue
        edges[own] |= {other for other in map(part_of, _imported(path))
                       if other in known and other != own}
    return edges


def table() -> str:
    edges = graph()
    users: dict[str, set[str]] = {part: set() for part in edges}
    for part, deps in edges.items():
        for dep in deps:
            users.setdefault(dep, set()).add(part)
    lines = ["| part of training/ | imports | imported by |", "|---|---|---|"]
    for part in sorted(edges, key=lambda p: (len(edges[p]), p)):
        lines.append(f"| `{part}` | {', '.join(sorted(edges[part])) or '-'} | "
                     f"{', '.join(sorted(users.get(part, ()))) or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.floors")
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    if not BLOCK.search(text):
        print(f"{DOC} has no <!-- floors:begin --> ... <!-- floors:end --> block",
              file=sys.stderr)
        return 2
    fresh = BLOCK.sub(lambda m: m.group(1) + table() + "\n" + m.group(2), text)
    if args.check:
        if fresh != text:
            print(f"{DOC.name} is out of date: run `python -m training.floors`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
