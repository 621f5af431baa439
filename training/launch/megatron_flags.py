"""Every flag megatron-core's parser (with this project's own, training/arguments.py) accepts,
recorded as data: the launcher checks the --flags a user gives after the script name against it
before torchrun, without importing Megatron (slow). An unknown flag is refused with the nearest
known one (`--log-param-norm`: did you mean --log-params-norm?).

    python -m training.launch.megatron_flags          rewrites megatron_flags.json from the
                                                      installed parser (megatron-core 0.19.2)

A test checks the record against the installed parser. Another Megatron (AMD's fork, in a
PLATFORM's image) may have more flags: there an unknown flag is a warning, not a refusal.
"""
from __future__ import annotations

import difflib
import functools
import json
import sys
from pathlib import Path

from training.reading import read_json

RECORD = Path(__file__).with_name("megatron_flags.json")


def from_parser() -> dict:
    from training.arguments import megatron_parser
    from training.launch.megatron_info import STOCK_VERSION

    flags = sorted({o for a in megatron_parser()._actions for o in a.option_strings
                    if o.startswith("--")})
    return {"megatron_core": STOCK_VERSION,
            "source": "training.arguments.megatron_parser(): megatron-core's "
                      "add_megatron_arguments + training/arguments.py",
            "flags": flags}


@functools.cache
def known() -> frozenset[str]:
    return frozenset(read_json(RECORD, "recorded Megatron flags")["flags"])


def unknown_flags(words: list[str]) -> list[str]:
    """`--flag` words (before any `=`) the recorded parser does not know, each with the
    nearest known flag when one is close."""
    out = []
    for word in words:
        if not word.startswith("--") or word == "--":
            continue
        flag = word.split("=", 1)[0]
        if flag in known():
            continue
        near = difflib.get_close_matches(flag, known(), n=1, cutoff=0.75)
        out.append(f"{flag}" + (f" (did you mean {near[0]}?)" if near else ""))
    return out


if __name__ == "__main__":
    RECORD.write_text(json.dumps(from_parser(), indent=1) + "\n")
    print(f"wrote {RECORD}", file=sys.stderr)
