"""Can the tests fail? One- or two-line changes a careless refactor could make (mutations), each
run against the tests that should catch it, in a copy of the tree (the working tree is never
touched). docs/testing.md explains; its table is generated from the record this writes.

    python -m tests.mutations list
    python -m tests.mutations run rope_factor            # one mutation, its named tests
    python -m tests.mutations run --all --record         # every one; writes docs/mutations.json
    python -m tests.mutations run rope_factor --before main   # also: its test files in main
    python -m tests.mutations docs [--check]             # docs/testing.md's table

A mutation is caught when tests fail on the mutated copy that pass on the copy without it;
exit 0 is a survivor, and so is 5 (no test selected); any other exit (a collection error, a
syntax error) is neither and is reported so.
The selection is the fast one (-m "not gpu and not slow"): what the record says is caught is
caught without the slow tests. `run NAME --marks "not gpu"` adds them (not recorded).
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs" / "mutations.json"
DOC = REPO / "docs" / "testing.md"
FAST = "not gpu and not slow"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str                  # the file changed, from the repository root
    old: str                   # exact text, found once in that file
    new: str
    tests: tuple[str, ...]     # pytest node ids: the tests that must catch it
    what: str                  # what the change breaks, in one line
    marks: str = FAST



MUTATIONS: tuple[Mutation, ...] = (
    # -- the five cases of issue 43 -----------------------------------------------------------
    Mutation(
        "rope_factor", "training/checkpoint/layout.py",
        'factor=float(getattr(model, "rope_scaling_factor", 8.0)))',
        "factor=8.0)",
        ("tests/checkpoint/test_published.py",),
        "the checkpoint's shape (saved arguments, config) always writes rope-scaling factor 8.0"),
    Mutation(
        "optimizer_shard_cp", "training/optimize/memory.py",
        'shard = lay.dp * lay.cp if c["DISTRIBUTED_OPTIMIZER"] else 1',
        'shard = lay.dp if c["DISTRIBUTED_OPTIMIZER"] else 1',
        ("tests/optimize/test_memory.py", "tests/optimize/test_preflight.py"),
        "the memory estimate shards the distributed optimizer over DP, not DP x CP"),
    Mutation(
        "valid_size_boundary", "training/mlperf/rules.py",
        "held = max(info.tokens[0] - 1, 0) // seq",
        "held = info.tokens[0] // seq",
        ("tests/mlperf/test_closed_rules_guard.py",),
        "the MLPerf validation-size check counts one sequence too many at N x seq tokens"),
    Mutation(
        "moe_counts_tp_etp", "training/launch/toggles.py",
        '             (tp > 1, f"TP={tp} (the tensor-parallel gather needs host sizes)"),\n'
        '             (etp is not None and etp > 1, f"ETP={etp}"),\n', "",
        ("tests/moe/test_moe_launch.py",),
        "MOE_DEVICE_COUNTS (and the lean step) allowed at TP > 1 or ETP > 1 on an MoE launch"),
    Mutation(
        "adamw_kernel_remainder", "training/native/adamw_triton.py",
        "        high = tl.where(low < 0, high - 1, high)\n", "",
        ("tests/native/test_adamw.py",),
        "the Triton AdamW kernel rebuilds a master without its rounded-up high half's -1"),
    Mutation(
        "swiglu_offsets_int32", "training/native/swiglu.py",
        "        row = row.to(tl.int64)\n", "",
        ("tests/native/test_kernels_interpreted.py",),
        "the SwiGLU kernel's row offsets in int32 (they wrap past 2^31 elements)"),
    # -- five more pieces of configuration arithmetic -------------------------------------------
    Mutation(
        "model_parallel_cp", "training/run_description.py",
        "return self.tp * self.pp * self.cp", "return self.tp * self.pp",
        ("tests/launch/test_run_description.py", "tests/launch/test_guards.py"),
        "data-parallel size ignores CP (world / (TP x PP))"),
    Mutation(
        "microbatches_dp", "training/run_description.py",
        "return max(self.global_batch // max(self.mbs * self.dp, 1), 1)",
        "return max(self.global_batch // max(self.mbs, 1), 1)",
        ("tests/launch/test_run_description.py", "tests/launch/test_guards.py"),
        "micro-batches per step ignore DP (BS / MBS)"),
    Mutation(
        "flops_gqa", "training/metrics.py",
        "qkv = 2 * h * (model.q_width + 2 * model.kv_width)", "qkv = 2 * h * 3 * model.q_width",
        ("tests/test_metrics.py",),
        "FLOPs count K and V at the query width (GQA ignored)"),
    Mutation(
        "run_name_layers", "training/launch/runfolder.py",
        'layers = "" if num_layers == preset_layers else f"-{num_layers}L"', 'layers = ""',
        ("tests/launch/test_run_folder.py",),
        "a run at NUM_LAYERS below the preset's shares the full model's folder name"),
    Mutation(
        "expert_dp_pp", "training/optimize/memory.py",
        "return max(c.layout.world_size // (ep * etp * c.layout.pp), 1)",
        "return max(c.layout.world_size // (ep * etp), 1)",
        ("tests/moe/test_moe_memory.py", "tests/optimize/test_memory.py"),
        "the experts' optimizer state shards over world / (EP x ETP), PP left out"),
    Mutation(
        "lever_platform_weight", "training/optimize/levers.py",
        "                score += 10\n", "                score += 1\n",
        ("tests/optimize/test_levers.py", "tests/optimize/test_recipes.py",
         "tests/optimize/test_flow.py"),
        "the advisor quotes another GPU's measurement over this GPU's when its shape is closer"),
    # -- issue 55: the rule-level tests (a class, not one value) --------------------------------
    Mutation(
        "secret_aws_temporary_key", "training/credentials.py",
        '"AWS access key": r"(?:AKIA|ASIA)[0-9A-Z]{16}",', '"AWS access key": r"AKIA[0-9A-Z]{16}",',
        ("tests/launch/test_secret_rules.py",),
        "an AWS temporary access key id (ASIA...) is printed and recorded unmasked"),
    Mutation(
        "secret_word_keys", "training/credentials.py",
        '_LAST = frozenset({"TOKEN", "TOKENS", "KEY", "KEYS", "PAT", "AUTH", "SESSION"})',
        '_LAST = frozenset({"TOKEN", "TOKENS", "KEY", "PAT", "AUTH", "SESSION"})',
        ("tests/launch/test_secret_rules.py",),
        "a variable named ..._KEYS (API_KEYS) is shown in the table and manifest"),
    Mutation(
        "record_samples_count_finite", "training/records.py",
        "                or not math.isfinite(count) or count < 0:", "                or count < 0:",
        ("tests/test_record_rules.py",),
        "an MLPerf evaluation at a NaN or infinite sample count is read as a result"),
    Mutation(
        "search_memory_margin", "training/optimize/search.py",
        "    limit = MEMORY_BOUND_FRACTION * platform.memory_gib", "    limit = platform.memory_gib",
        ("tests/optimize/test_search_margin.py",),
        "the layout search ranks layouts estimated between 90% and 100% of the GPU's memory"),
    Mutation(
        "metrics_warmup_default", "training/launch/toggles.py",
        "    return min(max((total_iters or 0) // 5, 2), 10)",
        "    return min(max((total_iters or 0) // 4, 2), 10)",
        ("tests/launch/test_default_rules.py",),
        "METRICS_WARMUP_ITERS left unset skips a quarter of the run, not a fifth, from the speed"),
    # -- the projection (issue 54) -------------------------------------------------------------
    Mutation(
        "projection_loo_leak", "training/optimize/references.py",
        "fits[r.group] = efficiency.fit([s for s in samples if s.group != r.group], ridge,",
        "fits[r.group] = efficiency.fit(list(samples), ridge,",
        ("tests/optimize/test_project.py",),
        "the reference table's 'leave-one-out' error projects each row with a model fitted on it"),
    Mutation(
        "projection_a2a_overlap", "training/optimize/project.py",
        "        if a2a_overlapped(run):\n", "        if False:\n",
        ("tests/optimize/test_project.py",),
        "the expert all-to-all is never overlapped, whatever the recipe sets"),
    # -- documents kept apart (issue 51) ---------------------------------------------------------
    Mutation(
        "document_boundary_shift", "training/documents.py",
        "after_eod = torch.nonzero(flat == eod, as_tuple=False).view(-1) + 1",
        "after_eod = torch.nonzero(flat == eod, as_tuple=False).view(-1)",
        ("tests/documents/test_packed_batch.py", "tests/documents/test_document_attention.py"),
        "each document boundary one token early (the EOD joins the next document)"),
    Mutation(
        "document_mask_dropped_flex", "training/native/document_attention.py",
        "                return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx])\n",
        "                return q_idx >= kv_idx\n",
        ("tests/documents/test_document_attention.py",),
        "the native flex attention's block mask plain causal: documents not kept apart"),
    Mutation(
        "document_mask_dropped_loop", "training/native/document_attention.py",
        "torch.split(t, lengths_of(cu))", "torch.split(t, [t.shape[0]])",
        ("tests/documents/test_document_parity.py",),
        "the per-document attention over the whole packed row: documents not kept apart"),
)

BY_NAME = {m.name: m for m in MUTATIONS}


def applied(text: str, m: Mutation) -> str:
    count = text.count(m.old)
    if count != 1:
        raise ValueError(f"{m.name}: {m.path} holds its text {count} times (needs exactly 1): "
                         "update the mutation to the current code")
    return text.replace(m.old, m.new)


def _copy_tree(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files, as the tests see them."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _failed(output: str) -> list[str]:
    return sorted(set(re.findall(r"^FAILED (\S+)", output, re.M)))


def run(m: Mutation, before: str | None = None, verbose: bool = False,
        marks: str | None = None) -> dict:
    """Apply m to a copy of the tree, run its tests there (their files as of commit `before`,
    if given), report what happened. Where tests fail, the same tests run again without the
    mutation: only those that then pass count as catching it (a test already failing on the
    tree catches nothing)."""
    with tempfile.TemporaryDirectory(prefix=f"mutation-{m.name}-") as tmp:
        root = Path(tmp)
        _copy_tree(root)
        target = root / m.path
        original = target.read_text()
        target.write_text(applied(original, m))
        if before:
            for path in {node.split("::")[0] for node in m.tests}:
                (root / path).write_bytes(subprocess.run(
                    ["git", "show", f"{before}:{path}"], cwd=REPO, capture_output=True,
                    check=True).stdout)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
               "-m", marks or m.marks, *m.tests]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        failing_anyway: list[str] = []
        if proc.returncode == 1:
            target.write_text(original)
            control = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
            failing_anyway = _failed(control.stdout + control.stderr)
        seconds = time.monotonic() - start
    if verbose:
        print(output[-4000:])
    failed = [n for n in _failed(output) if n not in failing_anyway]
    outcome = {0: "survived", 5: "survived (no test selected)"}.get(
        proc.returncode, f"error (pytest exit {proc.returncode})")
    if proc.returncode == 1:
        outcome = "caught" if failed else "survived (only tests that fail without it failed)"
    summary = (output.strip().splitlines() or [""])[-1]
    return {"outcome": outcome, "failed": failed, "failing_without_it": failing_anyway,
            "summary": summary, "tests": list(m.tests),
            "tests_as_of": _short(before) if before else "this commit",
            "marks": marks or m.marks, "seconds": round(seconds, 1)}


def _short(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()


def _commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return sha + ("+changes" if dirty else "")


def _load_record() -> dict:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {"schema": 1, "mutations": {}}


# -- docs/testing.md's table ----------------------------------------------------------------------

BEGIN, END = "<!-- mutations:begin -->", "<!-- mutations:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(record: dict) -> str:
    rows = ["| mutation | file | what breaks | the tests before (commit) | now | caught by |",
            "|---|---|---|---|---|---|"]
    for m in MUTATIONS:
        entry = record["mutations"].get(m.name, {})
        now, before = entry.get("now", {}), entry.get("before")
        by = ", ".join(f"`{n.split('::')[-1]}`" for n in now.get("failed", [])[:3])
        more = len(now.get("failed", [])) - 3
        by += f" (+{more})" if more > 0 else ""
        rows.append(f"| `{m.name}` | `{m.path}` | {_cell(m.what)} | "
                    f"{before['outcome'] + ' (' + before['tests_as_of'] + ')' if before else 'not run'}"
                    " | "
                    f"{now.get('outcome', 'not run')} | {by} |")
    return "\n".join(rows)


def docs(check: bool) -> int:
    text = DOC.read_text()
    block = f"{BEGIN}\n<!-- generated by `python -m tests.mutations docs` from docs/mutations.json; do not edit -->\n{table(_load_record())}\n{END}"
    new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    if check:
        if new != text:
            print(f"{DOC.relative_to(REPO)} is stale: run python -m tests.mutations docs")
            return 1
        return 0
    DOC.write_text(new)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    r = sub.add_parser("run")
    r.add_argument("names", nargs="*")
    r.add_argument("--all", action="store_true")
    r.add_argument("--before", metavar="REV",
                   help="also run against its test files as they were at REV (main: without "
                        "a branch's new tests)")
    r.add_argument("--marks", help=f'pytest -m expression (default "{FAST}"; not with --record)')
    r.add_argument("--record", action="store_true", help=f"write {RECORD.relative_to(REPO)}")
    r.add_argument("-v", "--verbose", action="store_true")
    d = sub.add_parser("docs")
    d.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)

    if args.cmd == "list":
        for m in MUTATIONS:
            print(f"{m.name:24} {m.path}: {m.what}")
        return 0
    if args.cmd == "docs":
        return docs(args.check)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown or not (args.names or args.all):
        parser.error(f"name mutations from `list` (unknown: {', '.join(unknown)})" if unknown
                     else "name a mutation, or --all")
    if args.marks and args.record:
        parser.error("the record is of the fast selection: --marks without --record")
    chosen = MUTATIONS if args.all else [BY_NAME[n] for n in args.names]
    before = _short(args.before) if args.before else None   # once: main may move meanwhile
    record = _load_record()
    bad = 0
    for m in chosen:
        entry = {"commit": _commit(), "date": datetime.date.today().isoformat(),
                 "now": run(m, verbose=args.verbose, marks=args.marks)}
        if args.before:
            entry["before"] = run(m, before=before, verbose=args.verbose, marks=args.marks)
        line = f"{m.name}: {entry['now']['outcome']} ({entry['now']['summary']})"
        if "before" in entry:
            line += f"; with the tests of {before}: {entry['before']['outcome']}"
        print(line, flush=True)
        bad += entry["now"]["outcome"] != "caught"
        record["mutations"][m.name] = {**record["mutations"].get(m.name, {}), **entry}
    if args.record:
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
