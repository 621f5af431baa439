"""Megatron-core pretraining launcher (docs/architecture.md: what lives where).

training.launch   above the torchrun seam: toggles, recipes, guards, capabilities, run folder;
                  recipe layers plug in from above (training.mlperf.layer).
training.deploy   Slurm, docker and image tools that run the example scripts on hosts.
training.run_description   the resolved run, typed: shared by both sides of the seam.
everything else   below the seam: the run under torchrun (pretrain_gpt, specs, metrics) and the
                  tools that read run folders (bench, profiling, optimize, convergence, mlperf).
"""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]   # the checkout: examples/, docs/, tests/


def _before_setup(hook):
    """A command run before `make setup` (a Python without the project's dependencies) ends
    with one line that says what to run, not a ModuleNotFoundError traceback."""
    def excepthook(kind, error, tb):
        name = (getattr(error, "name", None) or "").split(".")[0]
        if issubclass(kind, ModuleNotFoundError) and name and name != "training":
            import sys

            print(f"error: the Python package '{name}' is not installed for {sys.executable}: "
                  "run `make setup` in the repository, then use .venv/bin/python (or "
                  "`make train` / `make test`)", file=sys.stderr)
            raise SystemExit(2)
        hook(kind, error, tb)
    return excepthook


def _install_before_setup_hook() -> None:
    import sys

    if not getattr(sys.excepthook, "before_setup", False):
        sys.excepthook = _before_setup(sys.excepthook)
        sys.excepthook.before_setup = True


_install_before_setup_hook()
