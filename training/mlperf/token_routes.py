"""How many tokens each data route gives, measured: the launcher's default tokenization against
the MLPerf llama31_8b reference's (NeMo's preprocess_data_for_megatron.py without --append-eod:
no begin- and no end-of-document token).

    python -m training.mlperf.token_routes JSONL... --tokenizer DIR --out docs/mlperf/token_routes.json
    python -m training.mlperf.token_routes --docs     # docs/mlperf.md's table from that JSON

Routes (docs/mlperf.md, Data):
  adopt      the reference's own preprocessed files, recorded with `check adopt`: its tokens,
             whatever they are (counted from its .idx); not measurable here (not shipped)
  reference  prepare --no-add-special-tokens --no-append-eod on the raw JSON lines: the
             reference's tokens, byte for byte (tests/mlperf/test_reference_tokens.py)
  default    prepare as it is for any other dataset: the tokenizer's BOS before each
             document (Llama 3: <|begin_of_text|>) and EOD after it: 2 tokens more per document
The C4 figures are issue 22's (cited, not measured here: C4 is not shipped).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from training.cli import ArgumentParser, BadFile, fail, write_text
from training.data.errors import DataError
from training.reading import read_json

from .rules import REPO_ROOT

JSON_PATH = REPO_ROOT / "docs" / "mlperf" / "token_routes.json"
DOC = REPO_ROOT / "docs" / "mlperf.md"
BEGIN, END = "<!-- token-routes:begin -->", "<!-- token-routes:end -->"
ROUTES = {
    "reference": {"add_special_tokens": False, "append_eod": False,
                  "how": "`prepare --no-add-special-tokens --no-append-eod` (prepare_c4.sh)"},
    "default": {"add_special_tokens": True, "append_eod": True,
                "how": "`prepare` as for any dataset: BOS + text + EOD"},
}
# Issue 22's count of the 91205-document C4 validation file with BOS and EOD (not measured
# here); the reference's own count is config.yaml's reference_data (its README).
C4_WITH_BOS_EOS_ISSUE_22 = 47369265


def c4_validation() -> dict:
    from .rules import load

    ref = load().reference_data
    return {"documents": ref["eval_dataset_documents"],
            "reference_tokens": ref["eval_dataset_tokens"],
            "bos_eos_tokens": C4_WITH_BOS_EOS_ISSUE_22,
            "source": "issue 22; the reference's count is its README's"}


def measure(inputs: list[str], tokenizer: str) -> dict:
    """Documents and tokens of each route over `inputs` (built in a temporary folder)."""
    from training.data import prepare as prep
    from training.data.tokenizer import load

    out = {"inputs": [Path(p).name for p in inputs], "tokenizer_sha256": load(tokenizer).sha256,
           "command": "python -m training.mlperf.token_routes " + " ".join(
               [*(Path(p).name for p in inputs), "--tokenizer", Path(tokenizer).name]),
           "routes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, route in ROUTES.items():
            rows = []
            for i, path in enumerate(inputs):
                s = prep.prepare([path], f"{tmp}/{name}{i}", tokenizer, progress=False,
                                 workers=1, add_special_tokens=route["add_special_tokens"],
                                 append_eod=route["append_eod"])
                rows.append({"input": Path(path).name, "documents": s.documents,
                             "tokens": s.tokens})
            out["routes"][name] = {"how": route["how"], "datasets": rows}
    out["c4_validation_issue_22"] = c4_validation()
    return out


def _int(n: int) -> str:
    return f"{n:,}"


def render(data: dict) -> str:
    ref, default = data["routes"]["reference"], data["routes"]["default"]
    lines = ["| dataset | documents | reference route (no BOS, no EOD) | default (BOS + EOD) | "
             "difference |", "|---|---|---|---|---|"]
    for r, d in zip(ref["datasets"], default["datasets"]):
        lines.append(f"| shipped corpus `{r['input']}` (measured) | {_int(r['documents'])} | "
                     f"{_int(r['tokens'])} | {_int(d['tokens'])} | "
                     f"{_int(d['tokens'] - r['tokens'])} |")
    c4 = data["c4_validation_issue_22"]
    lines.append(f"| C4 validation, first {_int(c4['documents'])} documents ({c4['source']}) | "
                 f"{_int(c4['documents'])} | {_int(c4['reference_tokens'])} | "
                 f"{_int(c4['bos_eos_tokens'])} | "
                 f"{_int(c4['bos_eos_tokens'] - c4['reference_tokens'])} |")
    return "\n".join(lines)


def docs_block(data: dict | None = None) -> str:
    data = data or read_json(JSON_PATH, "token routes JSON")
    return f"{BEGIN}\n{render(data)}\n{END}"


def write_docs(doc: Path = DOC) -> None:
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(head + docs_block() + tail)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.mlperf.token_routes",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="*", help="JSON lines files to measure")
    parser.add_argument("--tokenizer", help="tokenizer directory")
    parser.add_argument("--out", type=Path, default=JSON_PATH)
    parser.add_argument("--docs", action="store_true", help="regenerate docs/mlperf.md's table")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs()
        return 0
    if not args.inputs or not args.tokenizer:
        parser.error("give JSONL inputs and --tokenizer (or --docs)")
    try:
        data = measure(args.inputs, args.tokenizer)
        write_text(args.out, json.dumps(data, indent=2) + "\n", "token counts JSON")
    except (DataError, BadFile) as err:
        return fail(str(err))
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
