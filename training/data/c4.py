"""What examples/mlperf/llama31_8b/prepare_c4.sh needs beyond `prepare`: its settings checked
before the long work, and the validation file (the first VALID_DOCS documents).

    python -m training.data.c4 check
        every setting, from the environment, before anything is written: C4_DIR (a folder
        holding the training shards FIRST_SHARD..LAST_SHARD and the 8 validation shards),
        FIRST_SHARD <= LAST_SHARD within 0..1023, VALID_DOCS a positive count, TOKENIZER (loads,
        has an eos token, encodes as AutoTokenizer does), OUT (a folder that can be written).
        One line and exit 2 for the first bad one.
    python -m training.data.c4 valid-json PATH
        the first VALID_DOCS lines of c4-validation.00000..00007-of-00008.json.gz, in order, to
        PATH: read with prepare's reader (a truncated shard fails, exit 1), written under a
        temporary name and renamed when complete; a PATH already there is kept (it can only
        be complete), so the script resumes.
"""

from __future__ import annotations

import os
import sys

from training.data.errors import DataError, InputError, Interrupted, RunError

TRAIN_SHARDS = 1024
VALID_SHARDS = 8
SETTINGS = ("C4_DIR", "TOKENIZER", "OUT", "FIRST_SHARD", "LAST_SHARD", "VALID_DOCS")


def train_shard(c4_dir: str, i: int) -> str:
    return os.path.join(c4_dir, f"c4-train.{i:05d}-of-{TRAIN_SHARDS:05d}.json.gz")


def valid_shard(c4_dir: str, i: int) -> str:
    return os.path.join(c4_dir, f"c4-validation.{i:05d}-of-{VALID_SHARDS:05d}.json.gz")


def _count(env: dict[str, str], name: str, lowest: int, highest: int | None = None) -> int:
    value = env.get(name, "")
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < lowest or (highest is not None and number > highest):
        bound = f"{lowest}..{highest}" if highest is not None else f"at least {lowest}"
        raise InputError(f"{name}={value!r}: must be a whole number, {bound}")
    return number


def check(env: dict[str, str]) -> str:
    """Every setting of prepare_c4.sh (InputError for the first bad one); a line saying what
    will be built."""
    from training.data import tokenizer as tokmod
    from training.data.publish import check_prefix, writable_folder

    missing = [n for n in SETTINGS if not env.get(n)]
    if missing:
        raise InputError(f"set {', '.join(missing)}: C4_DIR=/data/c4/en TOKENIZER=/models/Llama-3.1-8B "
                         "OUT=/data/c4_llama31 bash examples/mlperf/llama31_8b/prepare_c4.sh")
    c4_dir, out = env["C4_DIR"], env["OUT"]
    first = _count(env, "FIRST_SHARD", 0, TRAIN_SHARDS - 1)
    last = _count(env, "LAST_SHARD", 0, TRAIN_SHARDS - 1)
    if first > last:
        raise InputError(f"FIRST_SHARD={first} is after LAST_SHARD={last}: no shard in between; "
                         "give the lower number first")
    docs = _count(env, "VALID_DOCS", 1)
    if not os.path.isdir(c4_dir):
        raise InputError(f"C4_DIR={c4_dir}: not a folder (the one holding c4-train.*.json.gz)")
    shards = [train_shard(c4_dir, i) for i in range(first, last + 1)]
    shards += [valid_shard(c4_dir, i) for i in range(VALID_SHARDS)]
    absent = [p for p in shards if not os.path.isfile(p)]
    if absent:
        more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
        raise InputError(f"C4_DIR={c4_dir}: {os.path.basename(absent[0])}{more} not found; download "
                         "them first (docs/mlperf.md, Data)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"OUT={out}: is a file; name a folder")
    for name in ("c4-train.en_6", f"c4-validation-{docs}"):
        check_prefix(os.path.join(out, name), "OUT")
    writable_folder(out, f"OUT={out}")
    info = tokmod.load(env["TOKENIZER"])
    tokmod.check_library_agrees(info)
    return (f"settings checked: training shards {first}..{last} ({last - first + 1}), validation: the "
            f"first {docs} documents, tokenizer {info.path} (vocab {info.vocab_size}), into {out}")


def write_valid_json(path: str, c4_dir: str, docs: int) -> str:
    """The first `docs` lines of the validation shards, in order, into `path` (kept if there)."""
    from training.data.publish import SignalTrap, clean_stale, remove_quietly, temp_tag
    from training.data.sources import expand_inputs, read_chunks

    if os.path.isfile(path):
        return f"{path}: already there (written whole or not at all): kept"
    clean_stale([path], lambda line: print(line, file=sys.stderr))
    shards = expand_inputs([valid_shard(c4_dir, i) for i in range(VALID_SHARDS)])
    tmp = path + temp_tag()
    written = 0
    try:
        with SignalTrap(), open(tmp, "wb") as out:
            for index, shard in enumerate(shards):
                for chunk in read_chunks(index, shard):  # RunError for a truncated shard
                    for line in chunk.lines[:docs - written]:
                        out.write(line if line.endswith(b"\n") else line + b"\n")
                        written += 1
                    if written == docs:
                        break
                if written == docs:
                    break
            out.flush()
            os.fsync(out.fileno())
        if written < docs:
            raise RunError(f"the {VALID_SHARDS} validation shards hold {written} documents, fewer than "
                           f"VALID_DOCS={docs}")
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly([tmp])
        raise RunError(f"writing {path}: {e.strerror or e}; nothing left behind") from None
    except BaseException:
        remove_quietly([tmp])
        raise
    return f"{path}: the first {docs} validation documents"


def main(argv: list[str] | None = None) -> int:
    from training.cli import ArgumentParser

    parser = ArgumentParser(prog="python -m training.data.c4", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="every setting of prepare_c4.sh, from the environment")
    v = sub.add_parser("valid-json", help="the first VALID_DOCS validation documents into PATH")
    v.add_argument("path")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.command == "check":
            print(check(env))
        else:
            docs = _count(env, "VALID_DOCS", 1)
            print(write_valid_json(args.path, env.get("C4_DIR", ""), docs))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"interrupted: {args.command} stopped, nothing left half-written", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
