"""A command's --help names the command that was typed, not the one it borrows its parser from."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("module,prog", [
    ("training.moe.__main__", "python -m training.moe"),
    ("training.optimize.preflight", "python -m training.optimize.preflight"),
    ("training.moe.launch", "python -m training.moe.launch"),
    ("training.launch.__main__", "python -m training.launch"),
])
def test_help_names_the_command(module, prog, capsys):
    import importlib

    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(["--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} ")
