"""The MLPerf llama31_8b reference's tokenization, byte for byte, from raw JSON lines.

The reference makes its data with NeMo's preprocess_data_for_megatron.py (mlcommons/training,
small_llm_pretraining/nemo/utils/preprocess.sh: --tokenizer-library huggingface, no
--append-eod, no --split-sentences). Written here from that script's procedure, without NeMo:
each JSON line's text through transformers' AutoTokenizer as NeMo's wrapper calls it
(tokenize, then convert_tokens_to_ids: no special tokens), a document of no tokens skipped, the
tokens written in the dtype its builder picks from len(tokenizer) (uint16 below 65500, else
int32), and the .idx in the mmap format (header, version 1, dtype code, counts, int32 lengths,
int64 byte pointers, int64 document index). `prepare --no-add-special-tokens --no-append-eod`
must give the same two files, byte for byte; the default route gives BOS + EOD more."""
from __future__ import annotations

import json
import struct

import numpy

from training.data import prepare as prep
from training.mlperf import token_routes

DTYPE_CODES = {numpy.dtype(numpy.uint16): 8, numpy.dtype(numpy.int32): 4}


def nemo_procedure(jsonl, tokenizer_dir, prefix):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, use_fast=False)
    dtype = numpy.dtype(numpy.uint16 if len(tok) < 65500 else numpy.int32)
    sizes = []
    with open(f"{prefix}.bin", "wb") as out, open(jsonl, "rb") as lines:
        for line in lines:
            ids = tok.convert_tokens_to_ids(tok.tokenize(json.loads(line)["text"]))
            if not ids:
                continue
            out.write(numpy.asarray(ids, dtype=dtype).tobytes())
            sizes.append(len(ids))
    pointers = numpy.concatenate([[0], numpy.cumsum(sizes)[:-1]]) * dtype.itemsize
    with open(f"{prefix}.idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(sizes) + 1))
        idx.write(numpy.asarray(sizes, dtype=numpy.int32).tobytes())
        idx.write(numpy.asarray(pointers, dtype=numpy.int64).tobytes())
        idx.write(numpy.arange(len(sizes) + 1, dtype=numpy.int64).tobytes())


def _corpus(tmp_path):
    texts = ["The first document.", "", "  spaces  and\ttabs\n", "Ünïcödé — 東京, naïve café.",
             "<|end_of_text|> written in the text", "x" * 3000, "Last one, no newline at end"]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t, "url": "u"}) + "\n" for t in texts))
    return path, len([t for t in texts if t])


def test_the_reference_route_is_the_reference_byte_for_byte(mlperf_data, tmp_path):
    tokenizer = mlperf_data["TOKENIZER_MODEL"]
    jsonl, documents = _corpus(tmp_path)
    nemo_procedure(jsonl, tokenizer, tmp_path / "nemo")
    ours = prep.prepare([str(jsonl)], str(tmp_path / "ours"), tokenizer, progress=False,
                        workers=1, add_special_tokens=False, append_eod=False)
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours.{ext}").read_bytes() == (tmp_path / f"nemo.{ext}").read_bytes()
    assert ours.documents == documents

    default = prep.prepare([str(jsonl)], str(tmp_path / "default"), tokenizer, progress=False,
                           workers=1)
    assert default.documents == documents
    assert default.tokens == ours.tokens + 2 * documents          # BOS and EOD per document
    assert (tmp_path / "default.bin").read_bytes() != (tmp_path / "nemo.bin").read_bytes()


def test_measured_routes_differ_by_two_tokens_a_document_and_the_docs_show_the_json(
        mlperf_data, tmp_path):
    jsonl, documents = _corpus(tmp_path)
    data = token_routes.measure([str(jsonl)], mlperf_data["TOKENIZER_MODEL"])
    ref, default = (data["routes"][k]["datasets"][0] for k in ("reference", "default"))
    assert ref["documents"] == default["documents"] == documents
    assert default["tokens"] - ref["tokens"] == 2 * documents

    recorded = json.loads(token_routes.JSON_PATH.read_text())
    for ref, default in zip(recorded["routes"]["reference"]["datasets"],
                            recorded["routes"]["default"]["datasets"]):
        assert default["tokens"] - ref["tokens"] == 2 * ref["documents"]
    c4 = recorded["c4_validation_issue_22"]
    assert c4["bos_eos_tokens"] - c4["reference_tokens"] == 2 * c4["documents"]
    assert token_routes.docs_block(recorded) in token_routes.DOC.read_text(), \
        "docs/mlperf.md's token table is stale: python -m training.mlperf.token_routes --docs"
