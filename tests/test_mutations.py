"""tests/mutations.py stays true to the code: every mutation still applies (its text is found
once in its file), names test files that exist, and is recorded as caught; docs/testing.md's
table is the one generated from that record. Running the mutations is not part of the suite
(minutes): `python -m tests.mutations run --all --record`."""
from __future__ import annotations

import json

import pytest

from tests import mutations

RECORD = json.loads(mutations.RECORD.read_text())["mutations"]


@pytest.mark.parametrize("m", mutations.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_applies_to_the_current_code_and_was_caught(m):
    text = (mutations.REPO / m.path).read_text()
    assert mutations.applied(text, m) != text
    for node in m.tests:
        assert (mutations.REPO / node.split("::")[0]).is_file(), node
    assert RECORD[m.name]["now"]["outcome"] == "caught", \
        f"{m.name}: run python -m tests.mutations run {m.name} --record"


def test_a_mutation_whose_text_is_gone_is_refused():
    m = mutations.MUTATIONS[0]
    with pytest.raises(ValueError, match="exactly 1"):
        mutations.applied("", m)
    with pytest.raises(ValueError, match="2 times"):
        mutations.applied(m.old * 2, m)


def test_docs_table_is_the_generated_one():
    assert mutations.docs(check=True) == 0, "run python -m tests.mutations docs"
    for m in mutations.MUTATIONS:
        assert f"| `{m.name}` |" in mutations.DOC.read_text()
