"""What a Megatron offers for the precision recipes: the installed one, asked of its own parser
(imported lazily: slow), or the one a named platform's docker image runs, recorded below with
where each choice was read.

A DRY_RUN for PLATFORM=<name> is checked against that platform's image: docker/Dockerfile.cuda
runs the pinned megatron-core from PyPI (the one this venv has), docker/Dockerfile.rocm runs
AMD's fork, ROCm/Megatron-LM, at the commit below (its --fp4-recipe offers mxfp4, the MI355X
flagship recipe; stock megatron-core's does not). A real launch (PLATFORM=auto) asks the
Megatron it will run: the installed one. The records are data; a test checks the stock record
against the installed megatron-core, and the ROCm image's build re-checks the fork's with its
own parser (`python -m training.deploy.image check-megatron rocm`).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

# The Megatron flags that select a recipe, and the TransformerConfig field each is built from.
RECIPE_FLAGS = {"--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe", "--fp4-format": "fp4",
                "--fp4-recipe": "fp4_recipe"}


@dataclass(frozen=True)
class MegatronBuild:
    name: str                         # what it is, for messages
    choices: dict[str, tuple[str, ...]]   # recipe flag -> the values it accepts
    source: str                       # where the choices were read
    install: str = ""                 # how the image installs it

    def missing(self, words: list[str]) -> list[str]:
        """`--flag value` pairs among words that this Megatron's parser would reject."""
        out = []
        for flag, value in zip(words, words[1:]):
            offered = self.choices.get(flag)
            if offered is not None and value not in offered:
                out.append(f"{flag} {value} (it offers {', '.join(offered)})")
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "choices": {k: list(v) for k, v in self.choices.items()}}


# megatron-core 0.19.2 from PyPI (pyproject.toml's pin; docker/Dockerfile.cuda installs it).
STOCK_VERSION = "0.19.2"
STOCK = MegatronBuild(
    name=f"megatron-core {STOCK_VERSION} (PyPI)",
    choices={"--fp8-format": ("e4m3", "hybrid"),
             "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
             "--fp4-format": ("e2m1",), "--fp4-recipe": ("nvfp4", "custom")},
    source="megatron-core 0.19.2 (PyPI), megatron/core/transformer/transformer_config.py: the "
           "Literal types of fp8, fp8_recipe, fp4, fp4_recipe, from which "
           "megatron/training/argument_utils.py's ArgumentGroupFactory builds the flags",
    install=f"megatron-core=={STOCK_VERSION} (pyproject.toml)")

ROCM_MEGATRON_REPO = "https://github.com/ROCm/Megatron-LM"
ROCM_MEGATRON_COMMIT = "e6f97367979b84315baccbde57c383cba296fdf8"

# AMD's fork, as docker/Dockerfile.rocm installs it (ARG ROCM_MEGATRON_COMMIT).
ROCM_FORK = MegatronBuild(
    name=f"ROCm/Megatron-LM@{ROCM_MEGATRON_COMMIT[:7]} (AMD's fork)",
    choices={"--fp8-format": ("e4m3", "hybrid"),
             "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
             "--fp4-format": ("e2m1",), "--fp4-recipe": ("nvfp4", "mxfp4", "custom")},
    source=(f"github.com/ROCm/Megatron-LM@{ROCM_MEGATRON_COMMIT}, "
            "megatron/core/transformer/transformer_config.py: fp8 Literal['e4m3', 'hybrid'], "
            "fp8_recipe Literal['tensorwise', 'delayed', 'mxfp8', 'blockwise', 'custom'], "
            "fp4 Literal['e2m1'], fp4_recipe Literal['nvfp4', 'mxfp4', 'custom'] ('nvfp4 and "
            "mxfp4 ... NVFP4BlockScaling and MXFP4BlockScaling'); megatron/core/enums.py "
            "(Fp4Recipe.mxfp4, read at 705c37b); the flags are built from the config by "
            "ArgumentGroupFactory (megatron/training/argument_utils.py, read at 9784f40), as in "
            "megatron-core 0.19.2"),
    install=f"{ROCM_MEGATRON_REPO}@{ROCM_MEGATRON_COMMIT} (docker/Dockerfile.rocm)")

# vendor -> (the image, the Megatron it runs)
IMAGES = {"nvidia": ("docker/Dockerfile.cuda", STOCK), "amd": ("docker/Dockerfile.rocm", ROCM_FORK)}


def for_vendor(vendor: str) -> tuple[str, MegatronBuild]:
    return IMAGES[vendor]


@dataclass(frozen=True)
class RunningMegatron:
    """The Megatron a launch runs on, for its messages and the manifest."""
    build: MegatronBuild
    where: str                    # "here", or "in the h200 image (docker/Dockerfile.cuda)"
    image: str | None = None      # a named platform's Dockerfile; None: the one installed here

    def to_dict(self) -> dict | None:
        """The manifest's `megatron` section: a named platform's image and its Megatron's
        recipe choices (a real launch records the installed one under `versions`)."""
        return {"image": self.image, **self.build.to_dict()} if self.image else None


def running(caps) -> RunningMegatron:
    """The Megatron a launch with these capabilities runs (training.launch.capabilities): a
    named platform's image's (recorded above), else the one installed here (asked)."""
    if caps.source == "detected" or caps.info is None:
        return RunningMegatron(installed(), "here")
    image, build = for_vendor(caps.info.vendor)
    return RunningMegatron(build, f"in the {caps.platform} image ({image})", image)


def installed() -> MegatronBuild:
    """The recipe choices of the Megatron that imports here: the STOCK record when it is the
    pinned megatron-core from its wheel (a test checks the record against that parser), else
    read from its own parser (slow: Megatron's import)."""
    import importlib.metadata
    import importlib.util

    try:
        dist = importlib.metadata.distribution("megatron-core")
        spec = importlib.util.find_spec("megatron.core")
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        dist = spec = None
    if (dist is not None and spec is not None and dist.version == STOCK_VERSION
            and Path(spec.origin) == Path(dist.locate_file("megatron/core/__init__.py"))):
        return STOCK
    return asked()


@functools.cache
def asked() -> MegatronBuild:
    """The recipe choices of the Megatron that imports here, read from its own parser."""
    import argparse

    from megatron.core import package_info
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    choices = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option in RECIPE_FLAGS and action.choices is not None:
                choices[option] = tuple(str(getattr(c, "value", c)) for c in action.choices)
    return MegatronBuild(name=f"the installed megatron-core {package_info.__version__}",
                         choices=choices, source="its own argument parser")
