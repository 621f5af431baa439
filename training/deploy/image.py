"""Installing this package into a GPU base image without replacing the image's GPU stack.

The base images (docker/Dockerfile.cuda, docker/Dockerfile.rocm) carry a torch, Transformer
Engine, apex, Triton and flash-attention built for their CUDA or ROCm; pyproject.toml pins
torch==2.11.0 for the CPU/venv setup. So the image build

  1. checks the base: Python >= 3.12 (megatron-core 0.19.2 requires it), torch and
     Transformer Engine import                        (`python -m training.deploy.image check`)
  2. snapshots the stack                              (`python -m training.versions snapshot`)
  3. installs pyproject's other pins with the image's GPU packages frozen as constraints:
       pip list --format=freeze | python -m training.deploy.image constraints > /tmp/gpu-stack.txt
       python -m training.deploy.image requirements  > /tmp/requirements.txt
       pip install -c /tmp/gpu-stack.txt -r /tmp/requirements.txt
     a requirement that would replace one of them fails the build instead;
     GPU-kernel packages whose own dependency is torch/triton (liger-kernel) are installed
     with --no-deps, so pip never pulls a CUDA wheel of triton into a ROCm image
                                                      (`python -m training.deploy.image no-deps`)
  4. installs this package itself with --no-deps
  5. checks torch, Transformer Engine and apex are unchanged since the snapshot
                                                      (`python -m training.versions unchanged`)
     and that `import megatron.core` finds the pinned megatron-core
                                                      (`python -m training.deploy.image check-megatron`)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from training import REPO_ROOT

MIN_PYTHON = (3, 12)
# Provided by the base image, built for its CUDA/ROCm: never installed from pyproject.
IMAGE_PROVIDED = ("torch",)
# Their only runtime dependencies are the GPU stack: installed without dependencies.
NO_DEPS = ("liger-kernel",)
# Distributions frozen at the image's version during the install (normalised names, regex).
PROTECTED = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton(-rocm)?|"
                       r"transformer-engine.*|apex|flash-attn.*|amd-aiter|aiter|"
                       r"primus-turbo|nvidia-.*|cuda-.*)$")
EXTRAS = ("gpu",)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"cannot read a package name from {requirement!r}")
    return normalise(match.group(1))


def pyproject_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml",
                           extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """The project's dependencies and the named extras, as pyproject.toml pins them."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project.get("optional-dependencies", {})[extra]
    return reqs


def image_requirements(reqs: list[str]) -> tuple[list[str], list[str]]:
    """(installed with dependencies, installed with --no-deps); the image's own torch left out."""
    with_deps, no_deps = [], []
    for req in reqs:
        name = requirement_name(req)
        if name in IMAGE_PROVIDED:
            continue
        (no_deps if name in NO_DEPS else with_deps).append(req)
    return with_deps, no_deps


def gpu_stack_constraints(freeze: str) -> list[str]:
    """`pip list --format=freeze` lines of the image's GPU stack, as constraints (name==version).
    (`pip freeze` would print `name @ file://...` for source builds; those are skipped, and the
    before/after version check still covers them.)"""
    out = []
    for line in freeze.splitlines():
        line = line.strip()
        if "==" not in line or line.startswith(("#", "-")):
            continue
        name, version = line.split("==", 1)
        if PROTECTED.match(normalise(name)):
            out.append(f"{normalise(name)}=={version.strip()}")
    return out


def pinned_version(name: str, reqs: list[str]) -> str | None:
    """The ==version pyproject pins for a package, if it pins one."""
    for req in reqs:
        if requirement_name(req) == normalise(name) and "==" in req:
            return req.split("==", 1)[1].split(";")[0].strip()
    return None


def check_megatron(reqs: list[str]) -> list[str]:
    """The Megatron that imports is the pinned one (a base image may put its own Megatron-LM
    on PYTHONPATH, ahead of site-packages)."""
    want = pinned_version("megatron-core", reqs)
    try:
        from megatron.core import package_info
    except Exception as err:  # noqa: BLE001
        return [f"megatron.core does not import after the install ({err})."]
    got = str(getattr(package_info, "__version__", None))
    if want and got.split("+")[0] != want:  # a wheel reports e.g. 0.19.2+<commit>
        return [f"`import megatron.core` finds version {got} at {Path(package_info.__file__).parent},"
                f" not the pinned {want}: the base image puts another Megatron first on "
                "PYTHONPATH. Remove it from PYTHONPATH in the Dockerfile (ENV PYTHONPATH=...)."]
    return []


def check_base(version_info: tuple[int, ...] = tuple(sys.version_info)) -> list[str]:
    """Problems with the base image's Python; empty when it can take this package."""
    if tuple(version_info[:2]) < MIN_PYTHON:
        return [f"Python {'.'.join(map(str, version_info[:3]))} in the base image: megatron-core "
                f"0.19.2 needs Python >= {'.'.join(map(str, MIN_PYTHON))}. Use a newer base tag."]
    return []


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    action = args[0] if args else ""
    if action == "requirements":
        print("\n".join(image_requirements(pyproject_requirements())[0]))
    elif action == "no-deps":
        print("\n".join(image_requirements(pyproject_requirements())[1]))
    elif action == "constraints":
        print("\n".join(gpu_stack_constraints(sys.stdin.read())))
    elif action == "check-megatron":
        problems = check_megatron(pyproject_requirements())
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if problems:
            return 1
        from megatron.core import package_info
        print(f"megatron-core {package_info.__version__} from {Path(package_info.__file__).parent}")
    elif action == "check":
        problems = check_base()
        for module in ("torch", "transformer_engine"):
            try:
                __import__(module)
            except Exception as err:  # noqa: BLE001 - any failure: the base lacks it
                problems.append(f"{module} does not import in the base image ({err}).")
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"base image: Python {sys.version.split()[0]}, torch and transformer_engine import")
    else:
        print(__doc__)
        return 0 if action in ("-h", "--help") else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
