"""Which file a launcher may run: an example entry point of this repository, nothing else.

The docker and Slurm launchers run the script named on their command line (inside the
container, on every node, and for a DRY_RUN on the batch host): it must be a `.sh` file under
the repository's examples/ (examples/lib/ is a library, not an entry point), so a launcher
never runs a file a user merely names.
"""
from __future__ import annotations

from pathlib import Path

from training.launch.settings import BadInput


def entry_points(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in (repo / "examples").rglob("*.sh")
                  if "lib" not in p.relative_to(repo / "examples").parts[:1])


def example_script(script: str, repo: Path, cwd: Path | None = None) -> Path:
    """The example script as an absolute path inside repo/examples, or BadInput."""
    path = Path(script).expanduser()
    candidates = [path] if path.is_absolute() else [(cwd or repo) / path, repo / path]
    found = next((c for c in candidates if c.is_file()), None)
    known = ", ".join(entry_points(repo))
    if found is None:
        raise BadInput(f"no script {script!r}: give an example script of {repo}, one of {known}.")
    found = found.resolve()
    examples = (repo / "examples").resolve()
    if (examples not in found.parents or found.suffix != ".sh"
            or found.relative_to(examples).parts[0] == "lib"):
        raise BadInput(f"{script} is not an example entry point of {repo}: the launchers run "
                       f"only the repository's examples ({known}).")
    return found
