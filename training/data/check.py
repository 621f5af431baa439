"""Checks on DATA_PATH that run before torchrun: blend syntax, files, tokenizer agreement.

The launcher calls:

    parse_data_path("0.7 data/a 0.3 data/b")   -> [(0.7, "data/a"), (0.3, "data/b")]
    check_data_path(DATA_PATH, TOKENIZER_MODEL) -> DataInfo (or DataPathError)
    megatron_tokenizer_args(tokenizer_model)    -> ["--tokenizer-type", "HuggingFaceTokenizer", ...]
    parse_split("949,50,1")                     -> (949.0, 50.0, 1.0)
    check_data_paths([TRAIN, VALID], TOKENIZER_MODEL) -> [DataInfo, DataInfo], one tokenizer
    check_vocab_size(info, VOCAB_SIZE)          -> DataPathError unless equal (None: no check)

DATA_PATH follows Megatron's --data-path: one prefix, several prefixes (weighted by their
size), or weight/prefix pairs. Every prefix must have PREFIX.bin, PREFIX.idx and the record
PREFIX.dataset.json that training.data.prepare writes; all prefixes must share one
tokenizer, and it must be TOKENIZER_MODEL (same tokenizer.json content, same vocabulary
size and EOD id as Megatron will see them) when TOKENIZER_MODEL is given.

A dataset made elsewhere (e.g. Megatron's tools/preprocess_data.py) gets a record with

    python -m training.data.check adopt PREFIX --tokenizer-model DIR

which verifies every token id fits the tokenizer and reports documents without EOD.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field

from training.cli import ArgumentParser
from training.data import record as rec
from training.data import tokenizer as tokmod
from training.data.doc_lengths import LengthStats, describe, document_lengths, from_index
from training.data.errors import DataError
from training.data.index import IndexProblem, open_with_megatron, read_index


class DataPathError(ValueError):
    """DATA_PATH (or a split, or a tokenizer) cannot be used; the message says what to do."""


@dataclass(frozen=True)
class DataInfo:
    prefixes: list[str]
    weights: list[float] | None  # None: Megatron weights the prefixes by their size
    tokenizer_model: str  # directory to pass to Megatron as --tokenizer-model
    vocab_size: int
    eod_id: int
    documents: list[int] = field(default_factory=list)  # per prefix
    tokens: list[int] = field(default_factory=list)  # per prefix
    # per prefix: training.records.DocumentLengths, or None (a record written before them)
    document_lengths: list = field(default_factory=list)

    def megatron_data_args(self) -> list[str]:
        """The values of Megatron's --data-path (or --train-data-path ...) for this blend."""
        if self.weights is None:
            return list(self.prefixes)
        out: list[str] = []
        for w, p in zip(self.weights, self.prefixes):
            out += [_format_weight(w), p]
        return out


def _format_weight(w: float) -> str:
    return repr(w) if not float(w).is_integer() else str(int(w))


def _as_number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value


_BLEND_HELP = ("write one prefix ('data/c4'), several prefixes ('data/a data/b', weighted by "
               "size), or weight/prefix pairs ('0.7 data/a 0.3 data/b')")


def parse_data_path(value: str) -> list[tuple[float | None, str]]:
    """Megatron's blend syntax: [(None, prefix), ...] or [(weight, prefix), ...]."""
    if value is None or not value.strip():
        raise DataPathError(f"DATA_PATH is empty: {_BLEND_HELP}")
    tokens = value.split()
    numbers = [_as_number(t) for t in tokens]
    for t in tokens:
        if t.endswith((".bin", ".idx")):
            raise DataPathError(
                f"DATA_PATH names the file {t!r}; give the prefix without .bin/.idx ({t[:-4]!r})"
            )
    if all(n is None for n in numbers):
        return [(None, t) for t in tokens]
    if len(tokens) % 2:
        raise DataPathError(
            f"DATA_PATH {value!r} mixes weights and prefixes but has {len(tokens)} items; "
            f"weights and prefixes must come in pairs: {_BLEND_HELP}"
        )
    pairs: list[tuple[float | None, str]] = []
    for i in range(0, len(tokens), 2):
        w, p = numbers[i], tokens[i + 1]
        if w is None:
            raise DataPathError(
                f"DATA_PATH {value!r}: item {i + 1} ({tokens[i]!r}) should be a weight; "
                f"{_BLEND_HELP}"
            )
        if numbers[i + 1] is not None:
            raise DataPathError(
                f"DATA_PATH {value!r}: item {i + 2} ({p!r}) should be a prefix but is a number; "
                f"{_BLEND_HELP} (a prefix named like a number: write it as ./{p})"
            )
        if not math.isfinite(w) or w <= 0:
            raise DataPathError(
                f"DATA_PATH {value!r}: weight {tokens[i]!r} of {p!r} must be a positive number "
                "(to leave a dataset out, drop its pair)"
            )
        pairs.append((w, p))
    return pairs


def same_dataset(a: str, b: str) -> bool:
    """Two prefixes name one dataset (the same .bin, through any path or link)."""
    return os.path.realpath(a + ".bin") == os.path.realpath(b + ".bin")


def repeated_datasets(train: str, valid: str | None = None) -> str | None:
    """Why a blend names one dataset twice, or validates on training data; None when neither.
    A dataset twice in a blend is a weight in disguise (say it once, with the summed weight),
    and validation on a training dataset measures what the model memorised, not how it
    generalises."""
    prefixes = [p for _, p in parse_data_path(train)]
    for i, p in enumerate(prefixes):
        twice = next((q for q in prefixes[:i] if same_dataset(p, q)), None)
        if twice is not None:
            same = "" if twice == p else f" (as {twice} and {p})"
            return (f"DATA_PATH names the dataset {p} twice{same}: give it once, with the sum of "
                    "its weights, so the blend says what it does")
    if valid:
        for v in (p for _, p in parse_data_path(valid)):
            shared = next((p for p in prefixes if same_dataset(v, p)), None)
            if shared is not None:
                return (f"VALID_DATA_PATH's {v} is DATA_PATH's {shared}: validation on training "
                        "data measures what the model memorised. Give a held-out dataset, or "
                        "leave VALID_DATA_PATH unset (SPLIT then holds out part of DATA_PATH)")
    return None


def parse_split(value: str) -> tuple[float, float, float]:
    """Megatron's --split: 'train,valid,test' proportions, e.g. '949,50,1' or '98,2,0'."""
    parts = [p.strip() for p in str(value).replace("/", ",").split(",")]
    if len(parts) > 3 or any(p == "" for p in parts):
        raise DataPathError(f"SPLIT {value!r}: write up to three comma-separated proportions, e.g. 949,50,1")
    numbers = [_as_number(p) for p in parts]
    if any(n is None or not math.isfinite(n) or n < 0 for n in numbers):
        raise DataPathError(f"SPLIT {value!r}: proportions must be non-negative numbers, e.g. 949,50,1")
    numbers += [0.0] * (3 - len(numbers))
    if numbers[0] <= 0:
        raise DataPathError(f"SPLIT {value!r}: the train proportion must be positive, e.g. 949,50,1")
    return numbers[0], numbers[1], numbers[2]


def _tokenizer_dir(tokenizer_model: str) -> str:
    """The directory Megatron must load for `tokenizer_model` (a directory, its tokenizer.json,
    or a Hugging Face hub id: training/data/hub.py)."""
    from training.data import hub

    try:
        if hub.looks_like_hub_id(tokenizer_model):
            tokenizer_model = hub.tokenizer_folder(tokenizer_model)
        directory, loadable = tokmod.locate(tokenizer_model)
    except DataError as e:
        raise DataPathError(f"TOKENIZER_MODEL: {e}") from None
    if not loadable:
        raise DataPathError(
            f"TOKENIZER_MODEL={tokenizer_model} is a bare tokenizer file; Megatron loads a directory "
            "with tokenizer.json and tokenizer_config.json. Use the directory that "
            "training.data.prepare wrote (PREFIX.tokenizer/) or run: python -m "
            f"training.data.tokenizer wrap {tokenizer_model} --eod-token TOKEN --out DIR"
        )
    return directory


def megatron_tokenizer_args(tokenizer_model: str) -> list[str]:
    """Megatron (0.19.2) arguments that load this tokenizer (a folder, its tokenizer.json or a
    hub id) as the dataset saw it (tokenizer.megatron_args)."""
    return tokmod.megatron_args(_tokenizer_dir(tokenizer_model))


def _short(sha: str) -> str:
    return sha[:12]


_REBUILD = ("rebuild it (python -m training.data.prepare ... --overwrite) or copy the .bin, .idx "
            "and .dataset.json again")


def dataset_problem(prefix: str, record: dict, *, hash_bin: bool = False,
                    megatron: bool = False) -> str | None:
    """What is wrong with PREFIX.bin/.idx against each other and the record, or None.

    Always (the launcher's check): the sizes of both files against the record, the .idx read
    and checked against the .bin (training/data/index.py), its counts and SHA-256 against
    the record (records written before the hashes existed skip what they lack). hash_bin:
    also the .bin's SHA-256 (reads the whole file). megatron: also megatron-core's own
    IndexedDataset opens it (`check verify`; importing megatron takes seconds)."""
    bin_path, idx_path = prefix + ".bin", prefix + ".idx"
    size = os.path.getsize(bin_path)
    if record.get("bin_bytes") is not None and size != record["bin_bytes"]:
        return (f"{bin_path} has {size:,} bytes but its record says {record['bin_bytes']:,}: the "
                f"dataset was changed or partly copied since it was prepared; {_REBUILD}")
    idx_size = os.path.getsize(idx_path)
    if record.get("idx_bytes") is not None and idx_size != record["idx_bytes"]:
        return (f"{idx_path} has {idx_size:,} bytes but its record says {record['idx_bytes']:,}: the "
                f"index was changed or partly copied, or comes from another preparation; {_REBUILD}")
    try:
        facts = read_index(idx_path, bin_path)
    except IndexProblem as e:
        return f"{e}; {_REBUILD}"
    for key in ("documents", "tokens"):
        if record.get(key) is not None and record[key] != getattr(facts, key):
            return (f"{idx_path} counts {getattr(facts, key):,} {key} but its record says "
                    f"{record[key]:,}: the files come from another preparation; {_REBUILD}")
    hashed = [(idx_path, "idx_sha256")] + ([(bin_path, "bin_sha256")] if hash_bin else [])
    for path, key in hashed:
        if record.get(key) and tokmod.file_sha256(path) != record[key]:
            return (f"{path} is not the file its record was written with (SHA-256 differs): the dataset "
                    f"mixes files of two preparations or was changed; {_REBUILD}")
    if megatron:
        try:
            open_with_megatron(prefix)
        except IndexProblem as e:
            return f"{e}; {_REBUILD}"
    return None


def check_data_path(value: str, tokenizer_model: str | None, *, hash_bin: bool = False,
                    megatron: bool = False) -> DataInfo:
    """Check every prefix of DATA_PATH and that all agree with each other and TOKENIZER_MODEL
    (hash_bin, megatron: the deeper checks of dataset_problem)."""
    entries = parse_data_path(value)
    problems: list[str] = []
    records: list[tuple[str, dict]] = []
    for _, prefix in entries:
        missing = [p for p in (prefix + ".bin", prefix + ".idx") if not os.path.isfile(p)]
        if missing:
            tmp = [p for p in os.listdir(os.path.dirname(prefix) or ".")
                   if p.startswith(os.path.basename(prefix) + ".") and ".tmp-" in p] \
                if os.path.isdir(os.path.dirname(prefix) or ".") else []
            hint = (" (only temporary files of an unfinished preparation are there; run "
                    "training.data.prepare again)" if tmp else
                    " (build it with: python -m training.data.prepare INPUT --tokenizer DIR "
                    f"--output-prefix {prefix})")
            problems.append(f"{' and '.join(missing)} not found{hint}")
            continue
        try:
            record = rec.read_record(prefix)
        except rec.RecordError as e:
            if os.path.isfile(rec.record_path(prefix)):   # there, but not a record we write
                problems.append(
                    f"{e}; prepare the data again, or record it anew with: python -m "
                    f"training.data.check adopt {prefix} --tokenizer-model DIR --overwrite")
                continue
            problems.append(
                f"{e}: without it the tokenizer of {prefix} is unknown. If the dataset was made "
                f"elsewhere, record its tokenizer with: python -m training.data.check adopt "
                f"{prefix} --tokenizer-model DIR"
            )
            continue
        problem = dataset_problem(prefix, record, hash_bin=hash_bin, megatron=megatron)
        if problem is None:
            problem = _lengths_problem(prefix, record)
        if problem:
            problems.append(problem)
            continue
        records.append((prefix, record))
    if problems:
        raise DataPathError("DATA_PATH: " + "\n  ".join(problems) if len(problems) == 1
                            else "DATA_PATH has problems:\n  " + "\n  ".join(problems))

    first_prefix, first = records[0]
    ftok = first["tokenizer"]
    for prefix, record in records[1:]:
        tok = record["tokenizer"]
        if (tok["sha256"], tok["vocab_size"], tok["eod_id"]) != (ftok["sha256"], ftok["vocab_size"], ftok["eod_id"]):
            raise DataPathError(
                f"DATA_PATH blends datasets made with different tokenizers: {first_prefix} with "
                f"{ftok['path']} (sha256 {_short(ftok['sha256'])}, vocab {ftok['vocab_size']}, "
                f"EOD {ftok['eod_id']}) and {prefix} with {tok['path']} (sha256 "
                f"{_short(tok['sha256'])}, vocab {tok['vocab_size']}, EOD {tok['eod_id']}); "
                "re-prepare one of them with the other's tokenizer"
            )

    if tokenizer_model is None:
        directory = ftok["path"]
        if not os.path.isdir(directory):
            raise DataPathError(
                f"{first_prefix} was prepared with the tokenizer {directory}, which is not there any "
                "more; set TOKENIZER_MODEL to a copy of it"
            )
        _check_tokenizer(directory, ftok, first_prefix, "the recorded tokenizer")
    else:
        directory = _tokenizer_dir(tokenizer_model)
        _check_tokenizer(directory, ftok, first_prefix, f"TOKENIZER_MODEL={tokenizer_model}")

    weights = None if entries[0][0] is None else [w for w, _ in entries]
    return DataInfo(
        prefixes=[p for _, p in entries],
        weights=weights,
        tokenizer_model=os.path.abspath(directory),
        vocab_size=int(ftok["vocab_size"]),
        eod_id=int(ftok["eod_id"]),
        documents=[int(r.get("documents", 0)) for _, r in records],
        tokens=[int(r.get("tokens", 0)) for _, r in records],
        document_lengths=[document_lengths(r, rec.record_path(p)) for p, r in records],
    )


def _lengths_problem(prefix: str, record: dict) -> str | None:
    """A document-length section that does not fit its schema (training/records.py)."""
    from training.records import RecordError

    try:
        document_lengths(record, rec.record_path(prefix))
    except RecordError as e:
        return f"{e}; {_REBUILD}"
    return None


def _check_tokenizer(directory: str, recorded: dict, prefix: str, name: str) -> None:
    """`directory` must be the recorded tokenizer: same tokenizer.json, and the same
    vocabulary size and EOD as Megatron will see (loaded only when the config files differ)."""
    path = os.path.join(directory, tokmod.TOKENIZER_JSON)
    sha = tokmod.file_sha256(path)
    fix = (f"set TOKENIZER_MODEL={recorded['path']} (the tokenizer {prefix} was built with), or "
           f"rebuild the data with: python -m training.data.prepare ... --tokenizer {directory}")
    if sha != recorded["sha256"]:
        raise DataPathError(
            f"{name} is not the tokenizer {prefix} was prepared with: its tokenizer.json has sha256 "
            f"{_short(sha)}, the dataset's {_short(recorded['sha256'])} ({recorded['path']}); {fix}"
        )
    if tokmod.config_sha256(directory) == recorded["config_sha256"]:
        return
    try:
        vocab_size, eod_id, _, _ = tokmod.megatron_view(directory)
    except DataError as e:
        raise DataPathError(str(e)) from None
    if vocab_size != recorded["vocab_size"] or eod_id != recorded["eod_id"]:
        raise DataPathError(
            f"{name} has the same tokenizer.json as {prefix} but its tokenizer_config.json makes "
            f"Megatron see vocab size {vocab_size} and EOD {eod_id}, while the dataset was built "
            f"with vocab size {recorded['vocab_size']} and EOD {recorded['eod_id']}; {fix}"
        )


def check_data_paths(values: list[str], tokenizer_model: str | None) -> list[DataInfo]:
    """check_data_path for several blends that one run reads (train, valid, test paths):
    each is checked, and all must share one tokenizer (the first's, when none is given)."""
    infos: list[DataInfo] = []
    for value in values:
        expected = tokenizer_model
        if expected is None and infos:
            expected = infos[0].tokenizer_model
        infos.append(check_data_path(value, expected))
    return infos


def check_vocab_size(info: DataInfo, vocab_size: int | None) -> None:
    """Refuse a model vocabulary size (e.g. from a preset) that is not the dataset's.

    With --tokenizer-type HuggingFaceTokenizer Megatron takes the size from the tokenizer
    (then pads it to a multiple of --make-vocab-size-divisible-by x TP); a preset that
    assumes another size describes a different model from the one that will be trained.
    """
    if vocab_size is not None and int(vocab_size) != info.vocab_size:
        raise DataPathError(
            f"vocabulary size {vocab_size} disagrees with the data: {', '.join(info.prefixes)} were "
            f"tokenized with {info.tokenizer_model} (vocab size {info.vocab_size}); set the vocabulary "
            f"size to {info.vocab_size} or rebuild the data with the tokenizer of the model"
        )


# ----------------------------------------------------------------------------- adopt


def adopt(prefix: str, tokenizer_model: str, overwrite: bool = False) -> dict:
    """Write PREFIX.dataset.json for a dataset made elsewhere, after checking its token ids.

    Refuses if the .idx does not describe the .bin (training/data/index.py, then megatron's
    own reader) or any id is outside the tokenizer's vocabulary. Reports how many documents
    end with the tokenizer's EOD. Holds the prefix's lock while it works (publish.py).
    """
    import numpy as np

    from training.data.publish import Publisher

    for p in (prefix + ".bin", prefix + ".idx"):
        if not os.path.isfile(p):
            raise DataPathError(f"{p} not found")
    path = rec.record_path(prefix)
    with Publisher(prefix, option="PREFIX"):
        if os.path.exists(path) and not overwrite:
            raise DataPathError(f"{path} already exists; pass --overwrite to replace it")
        try:
            info = tokmod.load(_tokenizer_dir(tokenizer_model))
        except DataError as e:
            raise DataPathError(str(e)) from None
        try:
            facts = read_index(prefix + ".idx", prefix + ".bin")
            ds = open_with_megatron(prefix)
        except IndexProblem as e:
            raise DataPathError(f"{e}; the pair does not belong together or is damaged") from None
        dtype = facts.dtype
        bin_bytes = os.path.getsize(prefix + ".bin")
        data = np.memmap(prefix + ".bin", dtype=dtype, mode="r") if bin_bytes else np.zeros(0, dtype)
        top = int(data.max()) if data.size else -1
        if top >= info.vocab_size:
            raise DataPathError(
                f"{prefix}: token id {top} is outside the vocabulary of {info.path} (size "
                f"{info.vocab_size}); this is not the tokenizer the dataset was made with"
            )
        lengths = ds.index.sequence_lengths.astype(np.int64)
        doc_index = ds.index.document_indices.astype(np.int64)
        seq_ends = ds.index.sequence_pointers.astype(np.int64) // dtype.itemsize + lengths
        last_seq = doc_index[1:] - 1
        nonempty = doc_index[1:] > doc_index[:-1]
        ends = seq_ends[last_seq[nonempty]] - 1
        with_eod = int((data[ends] == info.eod_id).sum()) if ends.size else 0
        del ds
        record_dir = os.path.dirname(os.path.abspath(prefix))
        entry = {
            "prefix": os.path.basename(prefix),
            "tokenizer": rec.tokenizer_entry(info, record_dir),
            "adopted": True,
            "dtype": dtype.name,
            "documents": facts.documents,
            "tokens": facts.tokens,
            "bin_bytes": bin_bytes,
            "bin_sha256": tokmod.file_sha256(prefix + ".bin"),
            "idx_bytes": facts.idx_bytes,
            "idx_sha256": tokmod.file_sha256(prefix + ".idx"),
            "documents_ending_with_eod": with_eod,
            "document_lengths": LengthStats().add(lengths).summary(),
            "max_token_id": top,
        }
        rec.write_record(path, entry)
    return entry


# ----------------------------------------------------------------------------- CLI


def _cmd_verify(args: argparse.Namespace) -> int:
    info = check_data_path(args.data_path, args.tokenizer_model, hash_bin=args.full, megatron=True)
    print(f"DATA_PATH ok: {len(info.prefixes)} dataset(s)")
    for i, p in enumerate(info.prefixes):
        w = "size" if info.weights is None else _format_weight(info.weights[i])
        print(f"  {p}: {info.documents[i]:,} documents, {info.tokens[i]:,} tokens, weight {w}")
        lengths = info.document_lengths[i]
        if lengths is None:   # a record written before the lengths were: read the .idx
            section = from_index(p)
            lengths = document_lengths({"document_lengths": section}, p + ".idx") \
                if section else None
        if lengths is not None:
            print(f"    lengths: {describe(lengths)}")
    print(f"tokenizer {info.tokenizer_model} (vocab {info.vocab_size}, EOD {info.eod_id})")
    print("megatron args: " + " ".join(["--data-path", *info.megatron_data_args(),
                                        *megatron_tokenizer_args(info.tokenizer_model)]))
    return 0


def _cmd_adopt(args: argparse.Namespace) -> int:
    entry = adopt(args.prefix, args.tokenizer_model, args.overwrite)
    print(f"wrote {rec.record_path(args.prefix)}: {entry['documents']:,} documents, "
          f"{entry['tokens']:,} tokens, max id {entry['max_token_id']}")
    missing = entry["documents"] - entry["documents_ending_with_eod"]
    if missing:
        print(f"warning: {missing:,} of {entry['documents']:,} documents do not end with EOD "
              f"(id {entry['tokenizer']['eod_id']}); Megatron's preprocess_data.py adds it only "
              "with --append-eod", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m training.data.check",
        description="Check a DATA_PATH blend before training, or record the tokenizer of a dataset made elsewhere.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check DATA_PATH (blend syntax, files, .idx against .bin and record, "
                       "megatron's reader, tokenizer agreement)")
    v.add_argument("data_path", help="e.g. 'data/shakespeare/train' or '0.7 data/a 0.3 data/b' (quote it)")
    v.add_argument("--tokenizer-model", default=None, help="TOKENIZER_MODEL to check against (default: the recorded one)")
    v.add_argument("--full", action="store_true",
                   help="also compare the SHA-256 of every .bin with its record (reads every .bin once)")
    v.set_defaults(func=_cmd_verify)
    a = sub.add_parser("adopt", help="write PREFIX.dataset.json for a .bin/.idx made by other tools")
    a.add_argument("prefix")
    a.add_argument("--tokenizer-model", required=True, help="the tokenizer the dataset was made with")
    a.add_argument("--overwrite", action="store_true")
    a.set_defaults(func=_cmd_adopt)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DataPathError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
