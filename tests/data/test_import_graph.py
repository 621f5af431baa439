"""The modules of training/data import each other without a circle (issue 51: check ->
publish -> record -> tokenizer -> check was one). Every import counts, also those inside a
function (they run too, only later); `if TYPE_CHECKING:` blocks do not run and do not count."""
from __future__ import annotations

import ast
from pathlib import Path

import training.data

PACKAGE = "training.data"
FOLDER = Path(training.data.__file__).parent


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, modules: set[str]) -> set[str]:
    """The modules of MODULES that SOURCE imports, wherever the import statement is."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in modules:
                found.add(node.module)
            for alias in node.names:      # from training.data import record as rec
                if f"{node.module}.{alias.name}" in modules:
                    found.add(f"{node.module}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def import_graph(folder: Path = FOLDER, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = {f"{package}.{p.stem}": p for p in folder.glob("*.py") if p.stem != "__init__"}
    return {name: imports_of(path.read_text(), set(modules)) - {name}
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of GRAPH as [a, b, ..., a], or None."""
    state: dict[str, int] = {}      # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_training_data_imports_form_no_circle():
    graph = import_graph()
    assert len(graph) > 10          # the package's modules were found
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in training/data: " + " -> ".join(cycle)


def test_the_checker_finds_a_circle_through_a_function_level_import():
    a = "from training.data import b as bee\n"
    b = "def f():\n    from training.data.a import x\n"
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from training.data.a import x\n"
    modules = {"training.data.a", "training.data.b"}
    graph = {"training.data.a": imports_of(a, modules), "training.data.b": imports_of(b, modules)}
    assert find_cycle(graph) == ["training.data.a", "training.data.b", "training.data.a"]
    graph["training.data.b"] = imports_of(typed, modules)
    assert find_cycle(graph) is None


def test_record_is_a_leaf():
    """The record's reader and writer import nothing else of training.data (everything
    else may import it)."""
    assert import_graph()["training.data.record"] == set()
