"""mlperf-logging's compliance checker on an mlperf.log, with a per-check account.

    python -m training.mlperf.compliance <run>/mlperf.log [--ruleset 6.1.0] [--as-closed] [--json F]

runs the package's checker (the same code as `python -m mlperf_logging.compliance_checker
--usage training --ruleset 6.1.0 LOG`) and lists each failed check by its key. --as-closed also
checks a copy of the log with submission_division rewritten to closed: which closed-division
rules an open (e.g. tiny-model) run breaks. Exit status: 0 when the log passes, 1 otherwise.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.cli import ArgumentParser, BadFile, fail, write_text
from training.mlperf.rcp import ruleset_arg
from training.reading import RecordError, parse_json

DEFAULT_RULESET = "6.1.0"
_KEY_PATTERNS = (r"CHECK for '(\w+)'", r"occurrence of '(\w+)'", r"Failed checks for (\w+)",
                 r"Required AT_LEAST_ONE occurrence of '(\w+)'")


@dataclass
class Failure:
    key: str
    message: str


@dataclass
class Report:
    log: str
    ruleset: str
    division: str | None
    valid: bool
    failures: list[Failure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)

    @property
    def failed_keys(self) -> list[str]:
        return sorted({f.key for f in self.failures})


def _key_of(message: str) -> str:
    for pattern in _KEY_PATTERNS:
        found = re.search(pattern, message)
        if found:
            return found.group(1)
    return "(log)"


def division_of(log: Path) -> str | None:
    for number, line in enumerate(Path(log).read_text(errors="replace").splitlines(), 1):
        if '"key": "submission_division"' in line and ":::MLLOG " in line:
            try:
                event = parse_json(line.split(":::MLLOG ", 1)[1], f"{log}:{number}", "MLLOG event")
            except RecordError:
                return None
            value = event.get("value") if isinstance(event, dict) else None
            return value if isinstance(value, str) else None
    return None


def check(log: Path, ruleset: str = DEFAULT_RULESET, config: str | None = None) -> Report:
    """Run the checker on `log`; every failed check, keyed. `config`: a rule file of our own
    (the checker's --config) instead of the ruleset's common.yaml."""
    from mlperf_logging.compliance_checker import mlp_compliance

    checker = mlp_compliance.make_checker("training", ruleset, quiet=False, werror=False)
    config = config or f"training_{ruleset}/common.yaml"
    mlp_compliance.enqueued_configs.clear()
    configs: list[str] = []
    handler = _Collect(configs)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)  # the checker reports the rule files it reads at INFO
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            valid = checker.check_file(str(log), config)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    failures = [Failure(key, msg) for key, msg in checker.overwritable.items()]
    failures += [Failure(_key_of(msg), msg) for msg in checker.not_overwritable]
    return Report(str(log), ruleset, division_of(log), bool(valid), failures,
                  list(checker.warnings.values()), configs)


class _Collect(logging.Handler):
    """Remembers which rule files the checker went through ('Compliance checks: ...')."""

    def __init__(self, configs: list[str]):
        super().__init__(logging.INFO)
        self.configs = configs

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "Compliance checks:" in text:
            self.configs.append(text.split("Compliance checks:", 1)[1].strip())


def check_as_closed(log: Path, ruleset: str = DEFAULT_RULESET) -> Report:
    """The log checked as if it were a closed-division submission."""
    text = Path(log).read_text(errors="replace")
    closed = re.sub(r'("key": "submission_division", "value": )"\w+"', r'\1"closed"', text)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "mlperf_as_closed.log"
        copy.write_text(closed)
        report = check(copy, ruleset)
    report.log = f"{log} (submission_division rewritten to closed)"
    return report


def describe(message: str) -> str:
    """One line for a checker message: the failed test and the value the log holds."""
    lines = message.strip().splitlines()
    test = next((l.split("failed test:", 1)[1].strip() for l in lines if "failed test:" in l),
                None)
    logged = next((l for l in lines if l.startswith(":::MLLOG ")), None)
    if test and logged:
        try:
            event = parse_json(logged.split(":::MLLOG ", 1)[1], "the checker's message", "MLLOG event")
        except RecordError:
            event = None
        value = event.get("value") if isinstance(event, dict) else logged
        return f"{test} (logged: {value!r})"
    return lines[0] if lines else ""


def render(report: Report) -> str:
    lines = [f"{report.log}: ruleset {report.ruleset}, division {report.division}: "
             f"{'PASS' if report.valid else 'FAIL'}",
             f"  rule files: {', '.join(report.configs) or '-'}"]
    for failure in report.failures:
        lines.append(f"  FAILED {failure.key}: {describe(failure.message)}"[:300])
    for warning in report.warnings:
        lines.append(f"  warning: {warning.strip().splitlines()[0]}"[:300])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.mlperf.compliance",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--ruleset", default=DEFAULT_RULESET, type=ruleset_arg)
    parser.add_argument("--as-closed", action="store_true",
                        help="also check the log as a closed-division submission")
    parser.add_argument("--json", type=Path, default=None, help="write the reports here")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        print(f"error: {args.log} is not a file", file=sys.stderr)
        return 2
    if ":::MLLOG " not in args.log.read_text(errors="replace"):
        return fail(f"{args.log}: no :::MLLOG events; not an mlperf.log (an MLPerf run writes one, "
                    "examples/mlperf)")
    reports = [check(args.log, args.ruleset)]
    if args.as_closed:
        reports.append(check_as_closed(args.log, args.ruleset))
    for report in reports:
        print(render(report))
    if args.json:
        try:
            write_text(args.json, json.dumps([{**asdict(r), "failed_keys": r.failed_keys}
                                              for r in reports], indent=2) + "\n", "reports")
        except BadFile as err:
            return fail(str(err))
    return 0 if reports[0].valid else 1


if __name__ == "__main__":
    sys.exit(main())
