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
     or, in the ROCm image, AMD's fork with the recipe choices recorded for it, parsing the
     launcher's MI355X mxfp4 launch           (`python -m training.deploy.image check-megatron rocm`)
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


def check_megatron_fork(build=None, parse=None, targets=None) -> list[str]:
    """The ROCm image's Megatron is the fork training/launch/megatron_info.py records: its own
    parser offers the recorded recipe choices, every Megatron name this package imports exists
    in it, and so does every target of the run's patch table (training/megatron_patches.py),
    and it parses what the launcher emits for `PLATFORM=mi355x PRECISION=mxfp4` (every flag,
    ours included)."""
    from training.launch.megatron_info import ROCM_FORK, asked

    try:
        build = build or asked()
    except Exception as err:  # noqa: BLE001
        return [f"the Megatron on the path does not import or build its parser ({err})."]
    problems = []
    for flag, want in ROCM_FORK.choices.items():
        got = build.choices.get(flag)
        if got is None or set(got) != set(want):
            problems.append(f"{build.name} offers {flag} {', '.join(got or ('nothing',))}, not "
                            f"the recorded {', '.join(want)} ({ROCM_FORK.name}): the checkout "
                            "is not the pinned fork, or the record in megatron_info.py is stale.")
    if problems:
        return problems
    missing = missing_megatron_api(megatron_imports())
    if missing:
        return [f"the fork lacks what this package imports from Megatron: {'; '.join(missing)}."]
    if not (targets or _patch_targets_present)():
        return ["the fork lacks a target of the run's Megatron patch table (named above): "
                "training/megatron_patches.py would fail at the first run."]
    from training.launch.resolve import resolve

    launch = resolve("llama3", {"DRY_RUN": "1", "PLATFORM": "mi355x", "PRECISION": "mxfp4",
                                "EXPERIMENT_DIR": "/tmp/check-megatron"})
    words = [w for bucket in ("GPT_ARGS", "TRAIN_ARGS", "DATA_ARGS", "OUTPUT_ARGS", "EXTRA_ARGS")
             for w in launch.buckets[bucket]]
    try:
        (parse or _parse_as_the_run)(words)
    except SystemExit:
        return ["the fork's parser rejects the launcher's MI355X mxfp4 launch (its error above): "
                "a flag the launcher emits is not in this Megatron."]
    return []


def megatron_imports(root: Path = REPO_ROOT / "training") -> list[tuple[str, str | None, str]]:
    """(module, name or None, file) of every `import megatron...` / `from megatron... import`
    in this package, read from its source (nothing is imported)."""
    import ast

    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0
                    and (node.module or "").split(".")[0] == "megatron"):
                found.update((node.module, a.name, str(path.relative_to(root.parent)))
                             for a in node.names)
            elif isinstance(node, ast.Import):
                found.update((a.name, None, str(path.relative_to(root.parent)))
                             for a in node.names if a.name.split(".")[0] == "megatron")
    return sorted(found, key=lambda item: (item[0], item[1] or "", item[2]))


def missing_megatron_api(imports: list[tuple[str, str | None, str]]) -> list[str]:
    """The imports of this package that the Megatron on the path cannot satisfy."""
    import importlib
    import importlib.util

    missing = []
    for module, name, where in imports:
        try:
            mod = importlib.import_module(module)
            ok = (name is None or hasattr(mod, name)
                  or importlib.util.find_spec(f"{module}.{name}") is not None)
        except Exception:  # noqa: BLE001 - a module that does not import is missing
            ok = False
        if not ok:
            missing.append(f"{module}{'.' + name if name else ''} ({where})")
    return missing


def _patch_targets_present() -> bool:
    """The run's patch table against the Megatron on the path, in a process of its own
    (`python -m training.megatron_patches check`: it names what is missing)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "training.megatron_patches", "check"],
                          check=False).returncode == 0


def _parse_as_the_run(words: list[str]) -> None:
    """The words through the parser pretrain_gpt.py uses (Megatron's with ours:
    `python -m training.arguments parse`), in a process of its own, as deployment runs the
    run side (it imports nothing below the torchrun seam). SystemExit on a rejected word."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "training.arguments", "parse", *words],
                          check=False)
    if done.returncode:
        raise SystemExit(done.returncode)


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
        if args[1:] not in ([], ["rocm"]):
            print(f"error: check-megatron {' '.join(args[1:])}: use check-megatron (the stock "
                  "megatron-core) or check-megatron rocm (the ROCm fork)", file=sys.stderr)
            return 2
        fork = args[1:] == ["rocm"]
        problems = check_megatron_fork() if fork else check_megatron(pyproject_requirements())
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
    elif action in ("-h", "--help"):
        print(__doc__)
    else:
        print(f"error: {action or 'no action'}: use requirements, no-deps, constraints, check-megatron or "
              "check (python -m training.deploy.image --help explains them)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from training import quiet

    quiet.install("deploy.image")   # third-party notices at import: a count, not the console
    sys.exit(main())
