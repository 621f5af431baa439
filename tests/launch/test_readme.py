"""The generated tables (docs/toggles.md) match the registry and the guards; the README is a
front page whose quickstart is two commands."""
from __future__ import annotations

import re
from pathlib import Path

from training.launch import docs
from training.launch.guards import GUARDS
from training.launch.toggles import REGISTRY

README = Path(__file__).resolve().parents[2] / "README.md"
PAGE = README.parent / "docs" / "toggles.md"


def test_readme_tables_are_generated_from_the_registry():
    from training.mlperf import docs as mlperf_docs
    from training.mlperf.layer import TOGGLES, llama31_8b

    assert docs.main(["--check"]) == 0, \
        "docs/toggles.md is stale: run python -m training.launch.docs"
    assert mlperf_docs.main(["--check"]) == 0, \
        "docs/toggles.md is stale: run python -m training.mlperf.docs"
    text = PAGE.read_text()
    for toggle in (*REGISTRY, *TOGGLES):
        assert f"| `{toggle.name}` |" in text
    for fn in (*GUARDS, *llama31_8b().guards):
        assert f"| `{fn.__name__}` |" in text


def test_check_fails_on_a_stale_readme(tmp_path):
    stale = tmp_path / "toggles.md"
    stale.write_text(PAGE.read_text().replace("| `GRAD_REDUCE_IN_BF16` | 1 |",
                                                "| `GRAD_REDUCE_IN_BF16` | 0 |"))
    assert docs.main(["--check", "--readme", str(stale)]) == 1


def test_quickstart_is_exactly_make_train_and_make_test():
    block = re.search(r"## Quickstart\n\n(?:<!-- docs-test: \w+ -->\n\n)?```bash\n(.*?)```",
                      README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make train", "make test"]


def test_the_readme_is_a_front_page_that_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    for page in sorted((README.parent / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, page.name


def _measured_toggles() -> set[str]:
    """Toggles docs/levers.json has rows for (the toggles each lever sets, peers aside)."""
    import json

    data = json.loads((README.parent / "docs" / "levers.json").read_text())
    names = set()
    for lever in data["levers"]:
        if lever["kind"] != "peer":
            names |= {word.split("=")[0] for word in lever["set"].split() if "=" in word}
    return names


def test_help_points_at_the_measured_rows_of_every_measured_toggle():
    flagged = {t.name for t in REGISTRY if t.levers}
    assert flagged == _measured_toggles() & {t.name for t in REGISTRY}
    for toggle in REGISTRY:
        assert ("docs/levers.md" in toggle.description) is toggle.levers, toggle.name


def test_help_texts_quote_no_measured_figures():
    """Ratios, speedups and memory sizes live in docs/levers.json, not in help (a default's
    rule, "10% of TOTAL_ITERS", is no measurement)."""
    figure = re.compile(r"\d+(\.\d+)?\s*(x\b|GB\b|GiB\b|MB\b|ms\b|TFLOP)"
                        r"|\d+(\.\d+)?%\s*(faster|slower|more|less|higher|lower)")
    for toggle in REGISTRY:
        assert not figure.search(toggle.help), (toggle.name, toggle.help)
