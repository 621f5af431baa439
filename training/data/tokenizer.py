"""Tokenizers for data preparation and training: load, identify, train, wrap.

A tokenizer here is a Hugging Face *fast* tokenizer: a directory that transformers'
AutoTokenizer loads (tokenizer.json plus tokenizer_config.json naming the eos token), as
Megatron's `--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR` loads it. The Llama
3.1 tokenizer that MLPerf uses is one; `train` makes a small byte-level BPE one.

Identity is the SHA-256 of tokenizer.json (paths move, contents do not), plus the hash of
the files transformers reads around it (tokenizer_config.json, special_tokens_map.json),
which can change the eos token or add tokens. `vocab_size` and `eod_id` are what Megatron
sees: `len(AutoTokenizer)` and the id of the eos token (megatron.core's HuggingFaceTokenizer
uses the eos token as end of document).

    python -m training.data.tokenizer train data/*.jsonl --vocab-size 8192 --out tok/
    python -m training.data.tokenizer info tok/
    python -m training.data.tokenizer wrap llama.json --eod-token '<|end_of_text|>' --out tok/
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from typing import Iterable

from training.cli import ArgumentParser
from training.data.errors import DataError, InputError

TOKENIZER_JSON = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# Special tokens of the tokenizers `train` makes; Llama 3 names, so that a model trained on
# the sample corpus reads like one trained with the Llama 3 tokenizer.
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
# `train` refuses a larger vocabulary: no tokenizer in use comes close (Llama 3: 128,256;
# Gemma: 262,144), and the tokenizers library aborts the process (a Rust panic, no message
# Python can catch) when asked for ~1e9.
MAX_VOCAB_SIZE = 1 << 20
# Text encoded by both the tokenizers library and AutoTokenizer to prove they agree.
PROBE_TEXT = "Hello, world! It's 12:30.\n  Ünïcödé — 東京, naïve café.\tTabs  and  spaces.\n\n"


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_sha256(directory: str) -> str:
    """Hash of the files AutoTokenizer reads beside tokenizer.json (absent files count too)."""
    h = hashlib.sha256()
    for name in CONFIG_FILES:
        path = os.path.join(directory, name)
        h.update(name.encode() + b"\0")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                h.update(f.read())
        else:
            h.update(b"<absent>")
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class TokenizerInfo:
    path: str  # directory that AutoTokenizer and Megatron load
    sha256: str  # of tokenizer.json: the tokenizer's identity
    config_sha256: str  # of tokenizer_config.json + special_tokens_map.json
    vocab_size: int  # len(AutoTokenizer): Megatron's tokenizer.vocab_size
    eod_id: int  # id of the eos token: Megatron's tokenizer.eod
    eod_token: str
    bos_id: int | None

    @property
    def tokenizer_json(self) -> str:
        return os.path.join(self.path, TOKENIZER_JSON)

    def to_dict(self) -> dict:
        return asdict(self)


def check_tokenizer_json(path: str) -> None:
    """InputError unless `path` is a whole tokenizer.json (a JSON object with the `model` the
    tokenizers library builds from): an empty or cut-short file is refused here, before
    torchrun, not by AutoTokenizer on every rank."""
    from training.cli import BadFile
    from training.reading import read_json

    try:
        data = read_json(path, TOKENIZER_JSON)
    except BadFile as err:
        raise InputError(f"cannot load tokenizer {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise InputError(f"cannot load tokenizer {path}: not a Hugging Face {TOKENIZER_JSON} "
                         "(no `model` object): save the tokenizer again with save_pretrained")


def locate(path: str) -> tuple[str, bool]:
    """(directory, loadable) for a tokenizer directory or a tokenizer.json file.

    `loadable` is False for a bare tokenizer.json (no tokenizer_config.json beside it):
    AutoTokenizer would load it without an eos token, so it must be wrapped first.
    """
    if not os.path.exists(path):
        raise InputError(f"tokenizer {path}: no such file or directory")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, TOKENIZER_JSON)):
            extra = ""
            if os.path.isfile(os.path.join(path, "tokenizer.model")):
                extra = (" It has a SentencePiece tokenizer.model; save it as a fast tokenizer "
                         "first (AutoTokenizer.from_pretrained(DIR).save_pretrained(NEW_DIR)).")
            raise InputError(f"tokenizer {path}: the directory has no {TOKENIZER_JSON}.{extra}")
        check_tokenizer_json(os.path.join(path, TOKENIZER_JSON))
        return path, True
    if os.path.basename(path) == TOKENIZER_JSON:
        check_tokenizer_json(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == TOKENIZER_JSON and os.path.isfile(
        os.path.join(directory, CONFIG_FILES[0])
    ):
        return directory, True
    return directory, False


class EmptyCorpus(InputError):
    """`train` got no document (an empty corpus, or every line skipped)."""


def check_out_dir(out_dir: str, option: str = "--out") -> None:
    """Refuse an output directory that is an existing file (the tokenizer is a directory)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{option} {out_dir}: is a file; the tokenizer is written as a directory "
                         "(tokenizer.json + tokenizer_config.json): name a directory")


def bare_file_error(path: str) -> InputError:
    return InputError(
        f"tokenizer {path}: a bare tokenizer file does not say which token ends a document, "
        "and Megatron loads tokenizers as directories. Pass --eod-token TOKEN (e.g. "
        f"'{EOS_TOKEN}' for Llama 3) so that a loadable directory is written beside the "
        "dataset, or point at the Hugging Face tokenizer directory."
    )


@functools.lru_cache(maxsize=4)
def _auto_tokenizer(directory: str, sha: str, cfg_sha: str):
    """AutoTokenizer for `directory`, loaded once per content (the hashes are the key)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, use_fast=True, trust_remote_code=False)
    except Exception as e:  # transformers raises many types for a bad directory
        raise InputError(f"tokenizer {directory}: AutoTokenizer cannot load it: {e}") from None


@functools.lru_cache(maxsize=4)
def library_tokenizer(tokenizer_json: str, sha: str):
    """tokenizers.Tokenizer for `tokenizer_json`, loaded once per content."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tokenizer_json)


def _auto(directory: str):
    directory = os.path.abspath(directory)
    return _auto_tokenizer(directory, file_sha256(os.path.join(directory, TOKENIZER_JSON)),
                           config_sha256(directory))


def megatron_view(directory: str) -> tuple[int, int | None, str | None, int | None]:
    """(vocab_size, eod_id, eod_token, bos_id) as megatron-core's HuggingFaceTokenizer sees them.

    It loads AutoTokenizer.from_pretrained(DIR, use_fast=True), reports len(tokenizer) as the
    vocabulary size and the eos token's id as EOD; this does the same (tests compare the two).
    """
    tok = _auto(directory)
    eos = tok.eos_token
    eod_id = tok.convert_tokens_to_ids(eos) if eos is not None else None
    bos_id = tok.convert_tokens_to_ids(tok.bos_token) if tok.bos_token is not None else None
    return len(tok), eod_id, eos, bos_id


def load(path: str) -> TokenizerInfo:
    """Identity and Megatron's view of the tokenizer at `path` (a directory or tokenizer.json)."""
    directory, loadable = locate(path)
    if not loadable:
        raise bare_file_error(path)
    vocab_size, eod_id, eod_token, bos_id = megatron_view(directory)
    if eod_id is None:
        raise InputError(
            f"tokenizer {directory}: no eos_token in {CONFIG_FILES[0]}; Megatron uses the eos "
            "token as the end-of-document token. Add \"eos_token\": \"...\" to "
            f"{CONFIG_FILES[0]} (for Llama 3: \"{EOS_TOKEN}\")."
        )
    return TokenizerInfo(
        path=os.path.abspath(directory),
        sha256=file_sha256(os.path.join(directory, TOKENIZER_JSON)),
        config_sha256=config_sha256(directory),
        vocab_size=vocab_size,
        eod_id=eod_id,
        eod_token=eod_token,
        bos_id=bos_id,
    )


def check_library_agrees(info: TokenizerInfo, add_special_tokens: bool = True) -> None:
    """Refuse a tokenizer whose tokenizer.json encodes differently from AutoTokenizer.

    Preparation encodes with the tokenizers library (fast, parallel); Megatron wraps
    AutoTokenizer. Some tokenizer configs change behaviour beyond tokenizer.json (for
    example add_bos_token on Llama 2 tokenizers); then the dataset would not be what
    Megatron's tokenizer produces, so stop.
    """
    lib = library_tokenizer(info.tokenizer_json, info.sha256)
    ours = lib.encode(PROBE_TEXT, add_special_tokens=add_special_tokens).ids
    auto = _auto(info.path)
    theirs = auto(PROBE_TEXT, add_special_tokens=add_special_tokens)["input_ids"]
    if list(ours) != list(theirs):
        raise InputError(
            f"tokenizer {info.path}: tokenizer.json and AutoTokenizer encode a probe text "
            f"differently ({ours[:8]}... vs {theirs[:8]}...); {CONFIG_FILES[0]} changes the "
            "tokenizer's behaviour. Save it as one consistent file first: "
            "AutoTokenizer.from_pretrained(DIR).save_pretrained(NEW_DIR)."
        )


def wrap(tokenizer_file: str, eod_token: str, out_dir: str, bos_token: str | None = None,
         overwrite: bool = False) -> TokenizerInfo:
    """Make a directory Megatron can load from a bare tokenizer.json, naming its eos token.

    tokenizer.json is copied byte for byte (so its hash, the identity, is unchanged). OUT must
    be missing, empty, or a wrap of the same tokenizer.json; anything else is replaced only with
    overwrite (--overwrite).
    """
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(tokenizer_file)
    except Exception as e:
        raise InputError(f"tokenizer {tokenizer_file}: not a tokenizers JSON file: {e}") from None
    for name, token in (("--eod-token", eod_token), ("--bos-token", bos_token)):
        if token is not None and tok.token_to_id(token) is None:
            raise InputError(f"{name} {token!r} is not in the vocabulary of {tokenizer_file}")
    check_out_dir(out_dir)
    target = os.path.join(out_dir, TOKENIZER_JSON)
    if not overwrite:
        _check_wrap_target(tokenizer_file, out_dir, target)
    os.makedirs(out_dir, exist_ok=True)
    if os.path.abspath(tokenizer_file) != os.path.abspath(target):
        shutil.copyfile(tokenizer_file, target)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eod_token}
    if bos_token is not None:
        config["bos_token"] = bos_token
    from training.safe_files import open_write

    with open_write(os.path.join(out_dir, CONFIG_FILES[0]), CONFIG_FILES[0]) as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return load(out_dir)


def _check_wrap_target(tokenizer_file: str, out_dir: str, target: str) -> None:
    """InputError unless OUT is missing, empty, or holds only a wrap of this very tokenizer."""
    if not os.path.isdir(out_dir) or not os.listdir(out_dir):
        return
    ours = set(os.listdir(out_dir)) <= {TOKENIZER_JSON, *CONFIG_FILES}
    if ours and os.path.isfile(target):
        with open(tokenizer_file, "rb") as a, open(target, "rb") as b:
            if a.read() == b.read():
                return
    raise InputError(f"--out {out_dir} already holds "
                     + ("another tokenizer" if ours else "other files")
                     + ": name a new folder, or pass --overwrite to replace it")


def check_train_settings(vocab_size: int, min_frequency: int = 2) -> None:
    """InputError unless `train` can make a tokenizer of this size (checked before any work)."""
    smallest = 256 + 3  # every byte, BOS, EOS, PAD
    if vocab_size < smallest:
        raise InputError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least {smallest} "
                         "(256 bytes + 3 special tokens)")
    if vocab_size > MAX_VOCAB_SIZE:
        raise InputError(f"--vocab-size {vocab_size}: at most {MAX_VOCAB_SIZE:,} (Llama 3 has 128,256)")
    if min_frequency < 1:
        raise InputError(f"--min-frequency {min_frequency}: must be at least 1")


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str, min_frequency: int = 2) -> TokenizerInfo:
    """Train a byte-level BPE with the tokenizers library and save it as a directory.

    Byte-level: every byte has a token, so any text encodes without unknowns. Special
    tokens (ids 0, 1, 2): BOS, EOS (the end-of-document token), PAD. Like the Llama 3
    tokenizer, encoding adds BOS in front; the dataset builder appends EOS after each
    document.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN]
    check_train_settings(vocab_size, min_frequency)
    check_out_dir(out_dir)
    documents = 0

    def counted():
        nonlocal documents
        for text in texts:
            documents += 1
            yield text
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(counted(), trainer=trainer)
    if documents == 0:
        raise EmptyCorpus("no documents to train on: the corpus is empty or none of its lines is "
                          "a document; nothing written")
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    os.makedirs(out_dir, exist_ok=True)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    ).save_pretrained(out_dir)
    return load(out_dir)


def vocab_note(info: TokenizerInfo, asked: int, min_frequency: int = 2) -> str | None:
    """A line saying so when training learned fewer tokens than asked (a small corpus)."""
    if info.vocab_size >= asked:
        return None
    return (f"note: learned {info.vocab_size} tokens, fewer than the {asked} asked: the corpus has no "
            f"more pairs seen at least {min_frequency} times (a larger corpus gives more)")


# ----------------------------------------------------------------------------- CLI


def megatron_args(directory: str) -> list[str]:
    """Megatron (0.19.2) arguments that load the tokenizer in DIRECTORY (a folder with
    tokenizer.json and tokenizer_config.json) as the dataset saw it: build_tokenizer(args)
    with HuggingFaceTokenizer calls AutoTokenizer.from_pretrained(--tokenizer-model), whose
    vocab_size is len(tokenizer) and EOD the eos token (tests/data check this against the
    dataset record)."""
    return ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", directory]


def _print_info(info: TokenizerInfo) -> None:
    print(f"tokenizer     {info.path}")
    print(f"sha256        {info.sha256} (tokenizer.json)")
    print(f"vocab size    {info.vocab_size}")
    print(f"EOD           {info.eod_token!r} = {info.eod_id}")
    print(f"BOS           {info.bos_id}")
    print(f"megatron args {' '.join(megatron_args(info.path))}")


def _cmd_train(args: argparse.Namespace) -> int:
    from training.data.sources import Skip, expand_inputs, iter_texts

    check_train_settings(args.vocab_size, args.min_frequency)
    check_out_dir(args.out)
    files = expand_inputs(args.inputs, args.format)
    if os.path.exists(os.path.join(args.out, TOKENIZER_JSON)) and not args.overwrite:
        raise InputError(f"{args.out} already holds a tokenizer; pass --overwrite to replace it")
    skips: list[Skip] = []
    start = time.perf_counter()
    try:
        info = train_bpe(iter_texts(files, args.text_key, args.text_unit, skips), args.vocab_size,
                         args.out, args.min_frequency)
    except EmptyCorpus as e:
        if not skips:
            raise
        raise EmptyCorpus(f"{e} ({len(skips)} line(s) skipped; first: {skips[0]})") from None
    print(f"trained a byte-level BPE on {len(files)} file(s) in {time.perf_counter() - start:.1f} s")
    note = vocab_note(info, args.vocab_size, args.min_frequency)
    if note:
        print(note)
    if skips:
        print(f"skipped {len(skips)} line(s); first: {skips[0]}")
    _print_info(info)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    _print_info(load(args.tokenizer))
    return 0


def _cmd_wrap(args: argparse.Namespace) -> int:
    _print_info(wrap(args.tokenizer_file, args.eod_token, args.out, args.bos_token,
                     args.overwrite))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m training.data.tokenizer",
        description="Train, inspect or wrap a Hugging Face fast tokenizer for Megatron data.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a small byte-level BPE on a corpus (tests, small runs)")
    t.add_argument("inputs", nargs="+", help="files or globs: JSON lines or plain text, optionally .gz/.zst")
    t.add_argument("--out", required=True, help="directory to write (tokenizer.json + tokenizer_config.json)")
    t.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size including 3 special tokens (default 8192)")
    t.add_argument("--min-frequency", type=int, default=2, help="a merge needs this many occurrences (default 2)")
    t.add_argument("--text-key", default="text", help="JSON field holding the document (default: text)")
    t.add_argument("--format", default="auto", choices=("auto", "jsonl", "text"), help="input format (default: from the file name)")
    t.add_argument("--text-unit", default="file", choices=("file", "line"), help="plain text: one document per file or per line")
    t.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --out")
    t.set_defaults(func=_cmd_train)

    i = sub.add_parser("info", help="print identity, vocab size, EOD id and the Megatron arguments")
    i.add_argument("tokenizer", help="tokenizer directory or its tokenizer.json")
    i.set_defaults(func=_cmd_info)

    w = sub.add_parser("wrap", help="make a loadable directory from a bare tokenizer.json")
    w.add_argument("tokenizer_file")
    w.add_argument("--eod-token", required=True, help="token that ends a document, e.g. '<|end_of_text|>'")
    w.add_argument("--bos-token", default=None, help="beginning-of-text token, if any")
    w.add_argument("--out", required=True, help="directory to write")
    w.add_argument("--overwrite", action="store_true",
                   help="replace another tokenizer (or other files) in --out")
    w.set_defaults(func=_cmd_wrap)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
