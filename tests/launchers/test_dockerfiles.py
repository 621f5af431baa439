"""The Dockerfiles, read as text (no docker engine here): pinned bases, the install steps and
their order, and the image helpers they call."""
from __future__ import annotations

import re

import pytest

from training.deploy import image

from .conftest import REPO

DOCKERFILES = {"cuda": REPO / "docker/Dockerfile.cuda", "rocm": REPO / "docker/Dockerfile.rocm"}
BASE_PATTERN = {"cuda": r"nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3",
                "rocm": r"rocm/(primus|megatron-lm):v\d+\.\d+(\.\d+)?"}


def instructions(text: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if current.strip():
                out.append(" ".join(current.split()))
            current = ""
    return out


@pytest.fixture(params=sorted(DOCKERFILES))
def dockerfile(request):
    text = DOCKERFILES[request.param].read_text()
    return request.param, text, instructions(text)


def test_base_image_is_pinned_by_tag_and_its_source_is_named(dockerfile):
    vendor, text, steps = dockerfile
    arg = next(s for s in steps if s.startswith("ARG BASE_IMAGE="))
    base = arg.split("=", 1)[1]
    assert re.fullmatch(BASE_PATTERN[vendor], base), base
    assert "latest" not in base
    assert steps[steps.index(arg) + 1] == "FROM ${BASE_IMAGE}"
    assert [s for s in steps if s.startswith("FROM")] == ["FROM ${BASE_IMAGE}"]
    header = text.split("ARG BASE_IMAGE")[0]
    assert base in header, "the comment above names the tag it explains"
    assert "Where the tag comes from" in header and "Python 3.12" in header


def test_install_steps_in_order_and_this_package_without_dependencies(dockerfile):
    vendor, _text, steps = dockerfile
    runs = [s for s in steps if s.startswith("RUN ")]
    joined = "\n".join(runs)

    def first(needle):
        index = joined.find(needle)
        assert index >= 0, f"{vendor}: no step with {needle!r}"
        return index

    order = [first("python3 -m training.deploy.image check "),
             first("training.versions --require torch,transformer-engine"),
             first("snapshot /tmp/base-versions.json"),
             first("pip list --format=freeze | python3 -m training.deploy.image constraints"),
             first("pip install -c /tmp/gpu-stack.txt -r /tmp/requirements.txt"),
             first("pip install --no-deps -r /tmp/no-deps.txt"),
             first("pip install --no-deps -e ."),
             first("training.versions unchanged /tmp/base-versions.json torch transformer-engine"),
             first("training.deploy.image check-megatron")]
    assert order == sorted(order), f"{vendor}: steps out of order"
    for line in joined.replace("&&", "\n").splitlines():
        if "pip install" in line:
            assert "--no-deps" in line or "-c /tmp/gpu-stack.txt" in line, line
            assert not re.search(r"pip install\s+(-U\s+)?torch\b", line), line
    assert 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]' in steps


def test_each_image_requires_its_vendor_stack(dockerfile):
    vendor, _text, steps = dockerfile
    joined = " ".join(steps)
    required = re.search(r"--require (\S+) snapshot", joined).group(1).split(",")
    if vendor == "cuda":
        assert {"torch", "transformer-engine", "apex"} <= set(required)
        assert "nccl" in joined.split("unchanged")[1]
    else:
        assert {"torch", "transformer-engine", "aiter", "hip"} <= set(required)
        assert "rccl" in joined.split("unchanged")[1]


def test_build_context_is_an_allowlist(dockerfile):
    vendor, _text, steps = dockerfile
    ignore = (REPO / f"docker/Dockerfile.{vendor}.dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:] and "!training/" in ignore and "!pyproject.toml" in ignore
    copied = {s.split()[1] for s in steps if s.startswith("COPY ")}
    for path in copied:
        assert f"!{path.rstrip('/')}/" in ignore or f"!{path}" in ignore, path


# -- the helpers the Dockerfiles call --------------------------------------------------------------

def test_requirements_are_pyprojects_pins_without_torch():
    reqs = image.pyproject_requirements()
    assert "megatron-core==0.19.2" in reqs and "torch==2.11.0" in reqs
    with_deps, no_deps = image.image_requirements(reqs)
    assert "megatron-core==0.19.2" in with_deps
    assert not any(image.requirement_name(r) == "torch" for r in with_deps + no_deps)
    assert no_deps == ["liger-kernel==0.8.5"]
    assert image.pinned_version("megatron-core", reqs) == "0.19.2"


FREEZE = """\
torch==2.11.0a0+f3e4a5b.nv26.3
transformer_engine==2.12.0+7a9e2b1
transformer-engine-cu13==2.12.0
apex==0.1
triton==3.6.0
flash_attn==2.8.3
amd-aiter==0.1.14.post1
nvidia-nccl-cu13==2.28.9
numpy==2.3.1
rich==14.0.0
pytorch-triton-rocm==3.8.0
megatron-core==0.15.0
"""


def test_constraints_freeze_the_gpu_stack_only():
    cons = image.gpu_stack_constraints(FREEZE)
    assert "torch==2.11.0a0+f3e4a5b.nv26.3" in cons
    for name in ("transformer-engine==2.12.0+7a9e2b1", "transformer-engine-cu13==2.12.0",
                 "apex==0.1", "triton==3.6.0", "flash-attn==2.8.3", "amd-aiter==0.1.14.post1",
                 "nvidia-nccl-cu13==2.28.9", "pytorch-triton-rocm==3.8.0"):
        assert name in cons, name
    assert not any(c.startswith(("numpy", "rich", "megatron-core")) for c in cons)


@pytest.mark.parametrize("version,ok", [((3, 10, 12), False), ((3, 11, 9), False),
                                        ((3, 12, 3), True), ((3, 13, 0), True)])
def test_base_python_must_be_312(version, ok):
    problems = image.check_base(version)
    assert (problems == []) is ok
    if not ok:
        assert "megatron-core 0.19.2 needs Python >= 3.12" in problems[0]


@pytest.mark.slow
def test_megatron_check_passes_here_and_names_a_shadowing_megatron(monkeypatch):
    reqs = image.pyproject_requirements()
    assert image.check_megatron(reqs) == []
    shadow = [r.replace("megatron-core==0.19.2", "megatron-core==0.13.0") for r in reqs]
    problems = image.check_megatron(shadow)
    assert problems and "not the pinned 0.13.0" in problems[0] and "PYTHONPATH" in problems[0]


# -- the ROCm image runs AMD's Megatron fork ---------------------------------------------------------

def test_rocm_image_pins_the_fork_the_launcher_records_and_says_why():
    from training.launch import megatron_info

    text = DOCKERFILES["rocm"].read_text()
    steps = instructions(text)
    assert f"ARG ROCM_MEGATRON_COMMIT={megatron_info.ROCM_MEGATRON_COMMIT}" in steps
    header = text.split("ARG BASE_IMAGE")[0]
    assert "Which Megatron" in header and "mxfp4" in header and "ROCm/Megatron-LM" in header
    joined = "\n".join(steps)
    # the checkout comes first on the path, its helpers are built, the stock package is gone
    assert "ENV PYTHONPATH=/opt/rocm-megatron-lm${PYTHONPATH:+:${PYTHONPATH}}" in steps
    assert "make -C /opt/rocm-megatron-lm/megatron/core/datasets" in joined
    assert "pip uninstall -y megatron-core" in joined
    assert joined.index("pip uninstall -y megatron-core") < joined.index("check-megatron rocm")
    assert "check-megatron rocm" not in DOCKERFILES["cuda"].read_text()


def test_fork_check_passes_for_the_recorded_fork_and_parses_the_mxfp4_launch():
    from training.launch import megatron_info

    seen = []
    assert image.check_megatron_fork(megatron_info.ROCM_FORK, seen.append, lambda: True) == []
    [words] = seen
    assert words[words.index("--fp4-recipe") + 1] == "mxfp4"
    assert "--grad-reduce-in-bf16" in words and "--transformer-backend" in words


def test_fork_check_names_a_stock_megatron_on_the_path():
    """This venv's megatron-core is the stock one: its parser lacks mxfp4, and the check says so
    (the same message the ROCm image build would stop with)."""
    problems = image.check_megatron_fork()
    assert problems and "--fp4-recipe nvfp4, custom" in problems[0]
    assert "not the pinned fork" in problems[0]


def test_fork_check_fails_when_the_parser_rejects_a_launcher_flag():
    from training.launch import megatron_info

    def rejecting(words):
        raise SystemExit(2)

    [problem] = image.check_megatron_fork(megatron_info.ROCM_FORK, rejecting, lambda: True)
    assert "rejects the launcher's MI355X mxfp4 launch" in problem


def test_fork_check_fails_when_a_patch_target_is_missing():
    from training.launch import megatron_info

    [problem] = image.check_megatron_fork(megatron_info.ROCM_FORK, lambda words: None,
                                          lambda: False)
    assert "patch table" in problem


@pytest.mark.slow
def test_the_run_side_checks_run_against_the_installed_megatron_core(capfd):
    """What the ROCm image's build runs in processes of their own (deployment imports nothing
    of the run side): the patch table's targets and the launcher's words through the run's
    parser, here against the pinned megatron-core."""
    image._parse_as_the_run(["--transformer-backend", "native", "--nan-check", "step"])
    with pytest.raises(SystemExit):
        image._parse_as_the_run(["--no-such-flag"])
    assert image._patch_targets_present()
    # the third-party notices at import (Apex's fallbacks, ...) are a count, not the console
    err = capfd.readouterr().err
    rest = "".join(line for line in err.splitlines(True) if not line.startswith("[quiet] "))
    assert "UserWarning" not in rest and "Apex" not in rest, rest[-2000:]
    assert "[quiet] " in err and "known third-party warning line(s)" in err


def test_every_megatron_name_this_package_imports_exists_in_the_installed_megatron_core():
    """The list the ROCm image checks its fork against, read from the source: complete (the
    run side's entry points are in it) and satisfied by the pinned megatron-core here."""
    imports = image.megatron_imports()
    names = {(module, name) for module, name, _where in imports}
    assert ("megatron.training.arguments", "parse_and_validate_args") in names
    assert ("megatron.core.models.gpt", "GPTModel") in names
    assert image.missing_megatron_api(imports) == []
    assert image.missing_megatron_api([("megatron.core", "no_such_name", "x.py")]) == [
        "megatron.core.no_such_name (x.py)"]
