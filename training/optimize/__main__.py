"""`python -m training.optimize RUN`: recommend levers for one run from measured figures.

RUN is a run folder or a DRY_RUN manifest. Prints the report and writes it as JSON to
--json PATH (default: <run>/optimize.json). Exit status 0, or 2 with one line on stderr for
bad input (unknown path, no manifest, unreadable levers file, an impossible asked shape).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training import REPO_ROOT
from training.cli import ArgumentParser, fail, positive_int

from .inputs import BadInput



def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m training.optimize",
        description="Recommend levers for a concrete run from measured figures "
                    "(docs/optimize.md).")
    parser.add_argument("run", help="run folder, or a DRY_RUN manifest.json")
    parser.add_argument("--levers", default=None,
                        help="levers file (default: docs/levers.json when it exists)")
    parser.add_argument("--json", dest="json_path", default=None,
                        help="where to write the JSON report (default: <run>/optimize.json)")
    parser.add_argument("--no-json", action="store_true", help="do not write the JSON report")
    parser.add_argument("--platform", default=None,
                        help="GPU platform when the manifest has none (e.g. h200)")
    parser.add_argument("--want-seq-length", type=positive_int, default=None,
                        help="estimate and advise for this sequence length")
    parser.add_argument("--want-mbs", type=positive_int, default=None,
                        help="estimate and advise for this micro-batch size")
    parser.add_argument("--want-global-batch", type=positive_int, default=None,
                        help="advise for this global batch size")
    parser.add_argument("--quiet", action="store_true", help="no text report")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import levers as levers_mod
    from .advisor import advise
    from .inputs import load_run
    from .render import render

    try:
        inputs = load_run(args.run)
        for note in inputs.notes:
            print(f"note: {note}", file=sys.stderr)
        book = levers_mod.load_default(args.levers, REPO_ROOT)
        report = advise(inputs, book, platform=args.platform,
                        want={"seq_length": args.want_seq_length, "mbs": args.want_mbs,
                              "global_batch": args.want_global_batch})
        json_path = None
        if not args.no_json:
            json_path = Path(args.json_path) if args.json_path else inputs.run_dir / "optimize.json"
            report["json"] = str(json_path)
            try:
                from training.safe_files import write_text

                json_path.parent.mkdir(parents=True, exist_ok=True)
                write_text(json_path, json.dumps(report, indent=2, default=str) + "\n",
                           "JSON report")
            except OSError as err:
                raise BadInput(f"{json_path}: cannot write the JSON report "
                               f"({err.strerror or err}); pass --json PATH or --no-json") from None
    except BadInput as err:
        fail(str(err))
        return err.exit_code
    if not args.quiet:
        render(report)
        if json_path:
            print(f"\nJSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
