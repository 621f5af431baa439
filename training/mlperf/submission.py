"""An MLPerf Training llama31_8b submission: N runs, the submission layout, mlperf-logging's checkers.

    python -m training.mlperf.submission run --org ORG --platform NAME --out DIR [--runs 10]
        [--system ID] [--status S] [--system-json FILE] [-- KEY=VALUE ... for the runs]
    python -m training.mlperf.submission assemble --org ORG --platform NAME --out DIR RUN...
    python -m training.mlperf.submission check DIR [--ruleset 6.1.0]

`run` runs examples/mlperf/llama31_8b/run_llama31_8b.sh N times (each run draws its own seed,
drops the page cache, builds its index untimed), with MLPERF_ORG / MLPERF_PLATFORM set, each
into DIR/runs/.../run<i>/; then `assemble` and `check`. `assemble` lays the run folders out as
the package checker expects (training_policies' submission layout):

    DIR/<org>/results/<system>/llama31_8b/result_<i>.txt     each run's mlperf.log
    DIR/<org>/systems/<system>.json                          the system description
    DIR/<org>/benchmarks/llama31_8b/implementations/<impl>/README.md   what made the logs

The system description is filled from the runs' manifests (submitter, division, system name,
nodes, accelerators, their model, the software stack); the fields no run records (host CPU,
memory, storage, network, cooling, ...) are left empty and listed: fill them in (or pass
--system-json with them) before submitting. `check` runs, over DIR/<org>:
  - mlperf-logging's package checker (system description, each result's compliance, the seed
    checker and the RCP checker for a closed division), its log lines kept;
  - the RCP checker on the benchmark's results folder (the pruned RCPs, as the package checker);
  - closed division: this recipe's checks, as a compliance-checker rule file (the checker's
    --config): cache_clear true, and the validation set the reference's (documents and tokens,
    config.yaml's reference_data). mlperf-logging checks neither.
Exit 0 when everything passes, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.cli import ArgumentParser, fail, positive_int
from training.mlperf.rcp import ruleset_arg
from training.launch.runfolder import read_manifest
from training.reading import RecordError, read_json
from training.safe_files import write_text

from . import rules as rules_mod

USAGE = "training"
STATUSES = ("Available on-premise", "Available cloud", "Research, Development, or Internal (RDI)",
            "Preview")
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes",
    "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
    "host_processor_vcpu_count", "host_processor_frequency", "host_processor_caches",
    "host_processor_interconnect", "host_memory_capacity", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect",
    "accelerator_interconnect_topology", "cooling", "hw_notes", "framework",
    "other_software_stack", "operating_system", "sw_notes")


class BadInput(ValueError):
    exit_code = 2


def slug(name: str) -> str:
    """A system id from a platform name (the results folder and systems/<id>.json)."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip()).strip("_")
    if not out:
        raise BadInput(f"--platform {name!r}: give a name with letters or digits")
    return out


# -- assemble -----------------------------------------------------------------------------------

def _events(log: Path) -> dict:
    from .summary import read_events

    out: dict = {}
    for e in read_events(log):
        out.setdefault(e["key"], e)
    return out


def _manifest(run: Path) -> dict:
    try:
        return read_manifest(run)
    except RecordError:
        return {}


def system_description(org: str, platform: str, division: str, status: str,
                       manifests: list[dict]) -> dict:
    """The system description from what the runs recorded; unknown fields empty."""
    desc = dict.fromkeys(SYSTEM_FIELDS, "")
    desc.update(submitter=org, division=division, status=status, system_name=platform)
    m = next((m for m in manifests if m), {})
    values, layout = m.get("values") or {}, m.get("layout") or {}
    nodes = layout.get("nnodes") or values.get("NNODES")
    gpus = layout.get("gpus_per_node") or values.get("GPUS_PER_NODE")
    if nodes:
        desc["number_of_nodes"] = str(nodes)
    if gpus:
        desc["accelerators_per_node"] = str(gpus)
    run = m.get("run") or {}
    device = (run.get("summary") or {}).get("device")
    if device:
        desc["accelerator_model_name"] = device
    versions = run.get("versions") or m.get("versions") or {}
    stack = [f"{name} {versions[name]}" for name in ("megatron-core", "torch", "cuda", "nccl",
                                                     "transformer-engine", "liger-kernel")
             if versions.get(name)]
    sha = m.get("git_sha")
    desc["framework"] = ", ".join(["Megatron-core pretraining launcher"
                                   + (f" (git {sha[:12]})" if sha else ""), *stack])
    if versions.get("driver"):
        desc["other_software_stack"] = f"driver {versions['driver']}"
    return desc


def _rules_of(logs: list[Path]) -> rules_mod.Rules:
    """The recipe of the runs' benchmark (their mlperf.log's submission_benchmark)."""
    names = {(_events(log).get("submission_benchmark") or {}).get("value") for log in logs}
    names.discard(None)
    if len(names) > 1:
        raise BadInput(f"the runs are of several benchmarks ({', '.join(sorted(names))}): one "
                       "benchmark per assemble")
    name = names.pop() if names else "llama31_8b"
    if name not in rules_mod.CONFIGS:
        raise BadInput(f"the runs' benchmark {name!r} has no recipe here "
                       f"({', '.join(rules_mod.CONFIGS)})")
    return rules_mod.load_benchmark(name)


def _benchmarks_in(root: Path) -> list[rules_mod.Rules]:
    """The recipes of the benchmarks with a results folder under root (llama31_8b's if none)."""
    found = [rules_mod.load_benchmark(name) for name in rules_mod.CONFIGS
             if any((root / "results").glob(f"*/{name}"))]
    return found or [rules_mod.load()]


def assemble(runs: list[Path], out: Path, org: str, platform: str, system: str | None = None,
             status: str = STATUSES[2], extra: dict | None = None) -> Path:
    """The submission folder DIR/<org>/ from run folders (each with mlperf.log); returns it."""
    if status not in STATUSES:
        raise BadInput(f"--status {status!r}: one of {', '.join(repr(s) for s in STATUSES)}")
    if not runs:
        raise BadInput("no run folders given")
    logs = []
    for run in runs:
        log = run / "mlperf.log" if run.is_dir() else run
        if not log.is_file():
            raise BadInput(f"{run}: no mlperf.log")
        logs.append(log)
    rules = _rules_of(logs)
    divisions = {(_events(log).get("submission_division") or {}).get("value") for log in logs}
    if len(divisions) != 1 or None in divisions:
        raise BadInput(f"the runs' mlperf.log name divisions {sorted(map(str, divisions))}: "
                       "one division per submission")
    division = divisions.pop()
    system = system or slug(platform)
    root = out / slug(org)
    results = root / "results" / system / rules.benchmark
    if results.exists():
        raise BadInput(f"{results} already exists: choose another --out")
    results.mkdir(parents=True)
    for i, log in enumerate(logs):
        shutil.copyfile(log, results / f"result_{i}.txt")
    desc = system_description(org, platform, division, status,
                              [_manifest(log.parent) for log in logs])
    desc.update(extra or {})
    (root / "systems").mkdir(parents=True, exist_ok=True)
    write_text(root / "systems" / f"{system}.json", json.dumps(desc, indent=2) + "\n",
               "system description")
    impl = root / "benchmarks" / rules.benchmark / "implementations" / "megatron_launcher"
    impl.mkdir(parents=True, exist_ok=True)
    shas = sorted({_manifest(log.parent).get("git_sha") or "unknown" for log in logs})
    write_text(impl / "README.md", what="implementation README", text=(
        f"# {rules.benchmark}: Megatron-core pretraining launcher\n\n"
        f"Logs made by {rules.script} at git {', '.join(shas)};\n"
        "copy that commit's source tree here before submitting.\n"))
    return root


def unfilled(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "systems").glob("*.json")):
        desc = read_json(path, "system description JSON")
        if not isinstance(desc, dict):
            raise RecordError(f"{path}: not a system description (a JSON object)")
        out += [f"{path.name}: {k}" for k in SYSTEM_FIELDS if desc.get(k, "") == ""]
    return out


# -- check --------------------------------------------------------------------------------------

@dataclass
class Check:
    name: str
    passed: bool
    messages: list[str] = field(default_factory=list)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


@contextlib.contextmanager
def _captured_logging():
    handler, root = _Records(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield handler.records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def package_check(root: Path, ruleset: str) -> Check:
    """mlperf-logging's package checker over the submission folder."""
    from mlperf_logging.package_checker import package_checker

    with _captured_logging() as records:
        package_checker.check_training_package(str(root), USAGE, ruleset, False, False, False,
                                               False, False, os.devnull)
    errors = [m for level, m in records if level >= logging.ERROR]
    ok = any("PACKAGE CHECKER FOUND NO ERRORS" in m for _, m in records) and not errors
    notes = [m for level, m in records if level == logging.WARNING and m.strip()]
    return Check("package_checker", ok, [m.strip() for m in errors] + [n.strip() for n in notes])


def rcp_check(root: Path, ruleset: str) -> Check:
    """mlperf-logging's RCP checker on each benchmark folder (pruned RCPs, as the package
    checker runs it; no scaling.json written)."""
    from mlperf_logging.rcp_checker import rcp_checker

    messages, ok = [], True
    folders = [f for rules in _benchmarks_in(root)
               for f in sorted((root / "results").glob(f"*/{rules.benchmark}"))]
    for folder in folders:
        with _captured_logging():
            passed, msg, _ = rcp_checker.check_directory(str(folder), USAGE, ruleset, False,
                                                         False, rcp_pass="pruned_rcps")
        messages.append(f"{folder.parent.name}: {msg}, RCP test {'PASSED' if passed else 'FAILED'}")
        ok = ok and passed
    return Check("rcp_checker", ok and bool(messages), messages or ["no results folder"])


def recipe_rules_yaml(rules: rules_mod.Rules) -> str:
    """This recipe's closed-division checks, as a rule file for mlperf-logging's checker."""
    lines = ["- KEY:", "    NAME:  cache_clear", "    REQ:   AT_LEAST_ONE",
             "    CHECK: \" v['value'] == True \""]
    for key, value in rules.reference_data.items():
        lines += ["- KEY:", f"    NAME:  {key}", "    REQ:   EXACTLY_ONE",
                  f"    CHECK: \" v['value'] == {int(value)} \""]
    return "\n".join(lines) + "\n"


def recipe_check(root: Path, ruleset: str) -> Check:
    """Closed division: each result through the compliance checker with this recipe's rules."""
    from .compliance import check as compliance_check, describe

    messages, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for rules in _benchmarks_in(root):
            config = Path(tmp) / f"closed_{rules.benchmark}_recipe.yaml"
            config.write_text(recipe_rules_yaml(rules))
            for result in sorted((root / "results").glob(f"*/{rules.benchmark}/result_*.txt")):
                if (_events(result).get("submission_division") or {}).get("value") != "closed":
                    continue
                report = compliance_check(result, ruleset, config=str(config))
                for failure in report.failures:
                    messages.append(f"{result.name}: {failure.key}: {describe(failure.message)}")
                ok = ok and report.valid
    return Check("recipe_rules", ok, messages)


def check(root: Path, ruleset: str | None = None) -> list[Check]:
    ruleset = ruleset or _benchmarks_in(root)[0].ruleset
    return [package_check(root, ruleset), rcp_check(root, ruleset), recipe_check(root, ruleset)]


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.name}: {'PASS' if c.passed else 'FAIL'}")
        lines += [f"  {m.splitlines()[0][:300]}" for m in c.messages
                  if not c.passed or "RCP" in m]
    return "\n".join(lines)


# -- run ----------------------------------------------------------------------------------------

def run_all(n: int, out: Path, org: str, platform: str, words: list[str],
            environ: dict[str, str], benchmark: str = "llama31_8b") -> list[Path]:
    """N runs of the benchmark's entry script (run_llama31_8b.sh), one after the other; their
    run folders."""
    script = rules_mod.REPO_ROOT / rules_mod.load_benchmark(benchmark).script
    experiment = out / "runs"
    folders = []
    for i in range(n):
        env = dict(environ, MLPERF_ORG=org, MLPERF_PLATFORM=platform,
                   EXPERIMENT_DIR=str(experiment), RUN_ID=f"run{i}")
        print(f"== run {i + 1}/{n}", flush=True)
        proc = subprocess.run(["bash", str(script), *words], env=env, check=False)
        found = sorted(experiment.glob(f"**/run{i}/mlperf.log"))
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"run {i} failed (exit {proc.returncode}); its log is under "
                               f"{experiment}")
        folders.append(found[0].parent)
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.mlperf.submission",
                            description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--org", required=True, help="submission_org: your organization")
        p.add_argument("--platform", required=True, help="submission_platform and system_name")
        p.add_argument("--system", default=None, help="system id (default: from --platform)")
        p.add_argument("--status", default=STATUSES[2], choices=STATUSES)
        p.add_argument("--system-json", type=Path, default=None,
                       help="fields of the system description (merged over the generated ones)")
        p.add_argument("--out", type=Path, required=True, help="the submission folder")

    r = sub.add_parser("run", help="N runs, then assemble and check")
    common(r)
    r.add_argument("--runs", type=positive_int, default=10, help="runs (llama31_8b: 10)")
    r.add_argument("--benchmark", default="llama31_8b", choices=tuple(rules_mod.CONFIGS),
                   help="which recipe's entry script runs (assemble and check read the logs')")
    r.add_argument("words", nargs=argparse.REMAINDER, help="-- KEY=VALUE words for the runs")
    a = sub.add_parser("assemble", help="lay out run folders, then check")
    common(a)
    a.add_argument("runs", nargs="+", type=Path)
    c = sub.add_parser("check", help="check a submission folder (DIR/<org>)")
    c.add_argument("root", type=Path)
    for p in (r, a, c):
        p.add_argument("--ruleset", default=None, type=ruleset_arg, help="default: config.yaml's")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            if not (args.root / "results").is_dir():
                raise BadInput(f"{args.root}: no results/ folder (give DIR/<org>)")
            root = args.root
        else:
            extra = read_json(args.system_json, "system description JSON") if args.system_json else None
            if extra is not None and not isinstance(extra, dict):
                raise BadInput(f"{args.system_json}: not a JSON object of system description fields")
            if args.command == "run":
                words = args.words[1:] if args.words[:1] == ["--"] else args.words
                runs = run_all(args.runs, args.out, args.org, args.platform, words,
                               dict(os.environ), args.benchmark)
            else:
                runs = args.runs
            root = assemble(runs, args.out, args.org, args.platform, args.system, args.status,
                            extra)
            print(f"submission folder: {root}")
            for line in unfilled(root):
                print(f"  to fill in before submitting: {line}")
    except (BadInput, OSError, ValueError) as err:
        fail(str(err))
        return 2
    except RuntimeError as err:
        fail(str(err))
        return 1
    checks = check(root, args.ruleset)
    print(render(checks))
    write_text(root.parent / "checks.json",
               json.dumps([asdict(c) for c in checks], indent=2) + "\n", "checks JSON")
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
