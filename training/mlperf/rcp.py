"""The llama31_8b reference convergence points (RCPs) mlperf-logging ships, and the
hyperparameters they were measured with, by global batch size.

The RCP checker (mlperf_logging.rcp_checker) compares a closed submission's samples to converge
with the RCP of its batch size (interpolated between two RCPs, or failing with "Missing RCP,
please submit RCP with BS = N" above the largest). The recipe takes the learning rate and the
warm-up of the RCP of the run's batch size, so the run converges like the runs the checker
compares it with; where no RCP exists for the batch size it says so and takes the nearest RCP
below (the smallest above, below the smallest).

    python -m training.mlperf.rcp [--ruleset 6.1.0] [--benchmark gpt_oss_20b]     # the table
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from training.cli import ArgumentParser, fail
from training.reading import read_json

BENCHMARK = "llama31_8b"


@dataclass(frozen=True)
class RCP:
    name: str
    batch_size: int
    lr: float
    warmup_samples: int
    samples_to_converge: tuple[int, ...]


@dataclass(frozen=True)
class Choice:
    """What the recipe takes for a batch size, and from which RCP."""

    batch_size: int
    lr: float
    warmup_samples: int
    rcp: RCP
    exact: bool
    note: str        # empty for an exact RCP; otherwise what the RCP checker will do

    @property
    def warmup_iters(self) -> int:
        from .rules import warmup_iters

        return warmup_iters(self.warmup_samples, self.batch_size)


def rcp_file(ruleset: str, benchmark: str = BENCHMARK) -> Path:
    """The package's own RCP file (the path its checker reads). Found without importing the
    checker, which needs scipy: the launcher reads the file where scipy may be missing."""
    import importlib.util

    spec = importlib.util.find_spec("mlperf_logging")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("mlperf-logging is not installed (pip install -e '.[mlperf]')")
    return (Path(spec.origin).parent / "rcp_checker" / f"training_{ruleset}"
            / f"rcps_{benchmark}.json")


def installed_rulesets() -> list[str]:
    """The training rulesets the installed mlperf-logging checks (its training_<ruleset>
    folders); [] when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("mlperf_logging")
    if spec is None or spec.origin is None:
        return []
    found = Path(spec.origin).parent / "compliance_checker"
    return sorted(p.name.removeprefix("training_") for p in found.glob("training_*")
                  if p.is_dir() and re.fullmatch(r"training_\d+\.\d+\.\d+", p.name))


def ruleset_arg(text: str) -> str:
    """argparse type of --ruleset: one the installed checker has."""
    import argparse

    have = installed_rulesets()
    if text not in have:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a ruleset the installed mlperf-logging checks; use one of "
            f"{', '.join(have) or '(none: pip install -e .[mlperf])'}")
    return text


def load(ruleset: str, benchmark: str = BENCHMARK) -> list[RCP]:
    """The RCPs of the ruleset, by batch size."""
    raw = read_json(rcp_file(ruleset, benchmark), "RCP file")
    out = []
    for name, record in raw.items():
        if record["Benchmark"] != benchmark:
            continue
        hp = record["Hyperparams"]
        out.append(RCP(name, int(record["BS"]), float(hp["opt_base_learning_rate"]),
                       int(hp["opt_learning_rate_warmup_samples"]),
                       tuple(record["Epochs to converge"])))
    return sorted(out, key=lambda r: r.batch_size)


def choose(batch_size: int, rcps: list[RCP]) -> Choice:
    """LR and warm-up samples for `batch_size`: its RCP's, else the nearest RCP's, with why."""
    by_bs = {r.batch_size: r for r in rcps}
    if batch_size in by_bs:
        r = by_bs[batch_size]
        return Choice(batch_size, r.lr, r.warmup_samples, r, True, "")
    below = [r for r in rcps if r.batch_size < batch_size]
    above = [r for r in rcps if r.batch_size > batch_size]
    sizes = ", ".join(str(r.batch_size) for r in rcps)
    if below and above:
        r = below[-1]
        note = (f"no RCP for BS {batch_size} (mlperf-logging has {sizes}): the RCP checker "
                f"interpolates between BS {r.batch_size} and {above[0].batch_size}; LR and "
                f"warm-up samples taken from BS {r.batch_size}'s RCP")
    elif below:
        r = below[-1]
        note = (f"no RCP for BS {batch_size} (mlperf-logging has {sizes}): above the largest, "
                f"the RCP checker fails ('Missing RCP, please submit RCP with BS = "
                f"{batch_size}'); LR and warm-up samples taken from BS {r.batch_size}'s RCP")
    else:
        r = above[0]
        note = (f"no RCP for BS {batch_size} (mlperf-logging has {sizes}): below the smallest, "
                f"the RCP checker passes only a convergence slower than BS {r.batch_size}'s; LR "
                f"and warm-up samples taken from BS {r.batch_size}'s RCP")
    return Choice(batch_size, r.lr, r.warmup_samples, r, False, note)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.mlperf.rcp",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--ruleset", default="6.1.0", type=ruleset_arg)
    parser.add_argument("--benchmark", default=BENCHMARK, choices=("llama31_8b", "gpt_oss_20b"))
    args = parser.parse_args(argv)
    try:
        path = rcp_file(args.ruleset, args.benchmark)
    except FileNotFoundError as err:
        return fail(str(err))
    if not path.is_file():
        have = sorted(p.parent.name.removeprefix("training_")
                      for p in path.parent.parent.glob(f"training_*/{path.name}"))
        return fail(f"--ruleset {args.ruleset}: mlperf-logging has no {args.benchmark} RCPs for it; "
                    f"use one of {', '.join(have) or '(none installed)'}")
    print(f"{path}")
    print("| BS | LR | warm-up samples | WARMUP_ITERS | samples to converge (min-max) |")
    print("|---|---|---|---|---|")
    for r in load(args.ruleset, args.benchmark):
        c = choose(r.batch_size, [r])
        print(f"| {r.batch_size} | {r.lr:g} | {r.warmup_samples} | {c.warmup_iters} | "
              f"{min(r.samples_to_converge)}-{max(r.samples_to_converge)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
