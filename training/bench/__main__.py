"""`python -m training.bench <command>`

toggles  a default launcher run and each selected lever's variant (the five default-on
         toggles off, precision recipes, --levers recompute,mbs,...), interleaved repeats,
         one JSON: docs/benchmarks/toggles_<hw>_<shape>.json
peers    ours (launcher default) vs Megatron's local spec, HF LlamaForCausalLM (SDPA) with
         and without Liger, torchtitan, at one shape, one JSON
all      the named parts of both for this GPU count, each its own JSON, skipping parts
         already complete, as many as fit in --budget-s (one command per session);
         --te: the Transformer Engine parts instead (peers-te, te-recipes, te-toggles-*)
levers   regenerate docs/levers.json, docs/levers.md and docs/benchmarks.md from the JSONs
readme   regenerate docs/results.md's performance block (between the perf-table markers)
table    print the markdown table of one benchmark JSON

--plan prints the runs with estimated wall times and runs nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from training import REPO_ROOT
from training.cli import ArgumentParser, BadFile, fail, nonnegative_int, positive_float, positive_int

from training.reading import RecordError, read_json
from training.records import BenchResult, validate

from . import catalog, plan, record, suites, sweep
from .shape import BenchShape, hardware_tag
from .table import TABLE_KINDS, table

clock = time.monotonic  # `all` measures its budget with this (tests pass a fake clock)


def _given(args) -> dict:
    """The shape options given on the command line (the others are None: _shape_args)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchShape)
            if getattr(args, f.name, None) is not None}


def _shape(args, gpus: int | None = None) -> BenchShape:
    given = _given(args)
    return BenchShape(**{**given, "gpus": gpus or given.get("gpus", BenchShape().gpus)})


# What a part with its own shape (catalog.PART_SHAPES) takes from the command line: how long and
# how often to measure. Its model and layout stay its own, and the command says so.
RUN_COUNTS = ("steps", "warmup", "repeats")


def _part_shape(part: str, shape: BenchShape, given: dict) -> tuple[BenchShape, str | None]:
    """The shape a part of `bench all` runs at, and a note where an option given on the command
    line does not reach it."""
    own = catalog.PART_SHAPES.get(part)
    if own is None:
        return shape, None
    counts = {k: v for k, v in given.items() if k in RUN_COUNTS}
    ignored = sorted(k for k in given if k not in RUN_COUNTS and k != "gpus"
                     and given[k] != getattr(own, k))
    options = ", ".join("--" + k.replace("_", "-") for k in ignored)
    note = (f"keeps its own {own.tag()} shape; the given {options} shape the other parts only"
            if ignored else None)
    return dataclasses.replace(own, **counts), note


def _slot(text: str) -> tuple[int, int]:
    """--slot K/N: 0 <= K < N."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"{text!r}: write K/N with 0 <= K < N, e.g. 0/2 and 1/2")
    return int(k), int(n)


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _assignments(text: str | None) -> dict[str, str]:
    """'A=1,B=x' -> {'A': '1', 'B': 'x'}: registry toggles only."""
    from training.launch.toggles import BY_NAME

    out = {}
    for word in _list(text) or []:
        key, eq, value = word.partition("=")
        if not eq or key not in BY_NAME:
            raise ValueError(f"--ours-env {word!r}: use TOGGLE=VALUE with registry toggles, "
                             "comma-separated")
        out[key] = value
    return out


def _tools(args, family: str = "llama3"):
    """(precheck, availability, runner, calibration): the real ones."""
    from functools import partial

    from .ours import precheck
    from .runners import Runners, availability

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-"))
    runner = Runners(work, family=family, master_port=args.master_port,
                     timeout_s=args.timeout_s)
    return (partial(precheck, family=family), availability, runner,
            plan.calibrate(record.BENCH_DIR))


def _skipped(configs: list[sweep.Config]) -> list[tuple[str, str, str]]:
    return [(c.id, c.status, c.message) for c in configs if not c.runnable]


def _run_or_plan(args, kind: str, name: str, shape: BenchShape, configs, runner, cal,
                 out: Path, budget_s: float, extra: dict | None = None) -> int:
    specs = sweep.order(configs, shape)
    text = plan.format_plan(f"[{kind}] {name}", specs, _skipped(configs), cal, budget_s)
    print(text, flush=True)
    if args.plan:
        return 0
    header = record.header(name)
    result = suites.run_suite(kind, header, shape, configs, runner,
                              lambda s: plan.estimate(s, cal), out, budget_s, extra)
    print(table(result))
    print(f"[bench] wrote {out}" + ("" if result["complete"] else " (incomplete)"))
    return 0


def _default_name(kind: str, shape: BenchShape) -> str:
    return f"{kind}_{hardware_tag(record.gpu_info().get('name'), shape.gpus)}_{shape.tag()}"


def _name_and_out(args, kind: str, shape: BenchShape) -> tuple[str, Path]:
    name = args.name or _default_name(kind, shape)
    return name, Path(args.out) if args.out else record.BENCH_DIR / f"{name}.json"


def cmd_toggles(args) -> int:
    shape = _shape(args)
    try:
        levers = catalog.select(shape, _list(args.only), _list(args.levers), _list(args.keys))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    precheck, _availability, runner, cal = _tools(args)
    try:
        configs, default_values = suites.toggle_configs(shape, levers, precheck)
    except suites.SuiteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    name, out = _name_and_out(args, "toggles", shape)
    return _run_or_plan(args, "toggles", name, shape, configs, runner, cal, out,
                        args.budget_s or float("inf"), {"default_resolved": default_values})


def cmd_peers(args) -> int:
    shape = _shape(args)
    precheck, availability, runner, cal = _tools(args)
    try:
        ours_env = _assignments(args.ours_env)
        configs = suites.peer_configs(shape, _list(args.sides), precheck, availability,
                                      ours_env)
    except (suites.SuiteError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    name, out = _name_and_out(args, "peers", shape)
    return _run_or_plan(args, "peers", name, shape, configs, runner, cal, out,
                        args.budget_s or float("inf"))


def parts_for(gpus: int, te: bool = False) -> list[tuple[str, str, tuple[str, ...]]]:
    """(kind, part name, keys or sides) in the order `all` runs them (te: the Transformer
    Engine parts, one GPU each)."""
    if te:
        if gpus == 1:
            return list(catalog.TE_PARTS) + list(catalog.MOE_TE_PARTS)
        return [(kind, name, keys) for name, kind, keys in catalog.TE_NODE_PARTS.get(gpus, ())]
    if gpus == 1:
        return ([("peers", *catalog.PEER_PARTS[0])]
                + [("toggles", name, keys) for name, keys in catalog.PARTS_DP1]
                + [("peers", *part) for part in catalog.PEER_PARTS[1:]]
                + [(kind, name, keys) for name, kind, keys in catalog.PARTS_X1]
                + [(kind, name, keys) for name, kind, keys in catalog.MOE_PARTS])
    if gpus == 2:
        return ([("toggles", name, keys) for name, keys in catalog.PARTS_DP2]
                + [(kind, name, keys) for name, kind, keys in catalog.PARTS_X2])
    return [(kind, name, keys) for name, kind, keys in catalog.PARTS_NODE]


def _auto_needs_te(configs) -> None:
    """In a TE part the `auto` side stands for the TE image's default: refused where Transformer
    Engine does not import (auto would measure the native backend under that name)."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return
    if not any(config.id == "auto" for config in configs):
        return
    for config in configs:     # the part compares every side with auto: none runs
        if config.runnable:
            config.status, config.message = "refused", (
                "Transformer Engine does not import here: the auto side measures the default "
                "of an image with TE (send the TE carry first, dev/gpu_runbook.md)")


def cmd_all(args) -> int:
    shape = _shape(args)
    precheck, availability, runner, cal = _tools(args)
    out_dir = Path(args.out_dir) if args.out_dir else record.BENCH_DIR
    hw = hardware_tag(record.gpu_info().get("name"), shape.gpus)
    slot, slots = args.slot
    started = clock()
    budget = args.budget_s or float("inf")
    parts = parts_for(shape.gpus, te=args.te)
    if args.parts:
        wanted = _list(args.parts)
        unknown = [w for w in wanted if w not in {part for _, part, _ in parts}]
        if unknown:
            print(f"error: unknown part(s) {', '.join(unknown)} at {shape.gpus} GPU(s): use "
                  f"{', '.join(part for _, part, _ in parts)}", file=sys.stderr)
            return 2
        parts = [p for p in parts if p[1] in wanted]
    todo, lines = [], []
    given = _given(args)
    for kind, part, keys in parts:
        part_shape, note = _part_shape(part, shape, given)   # its own shape, or the command's
        name = f"{part}_{hw}_{part_shape.tag()}"
        if note:
            lines.append(f"  {name}: {note}")
        out = out_dir / f"{name}.json"
        # with --resume a complete JSON of fewer repeats than asked is extended, not done
        repeats = part_shape.repeats if args.resume else None
        if not args.force and (suites.is_complete(out, repeats)
                               or suites.is_complete(record.BENCH_DIR / f"{name}.json",
                                                     repeats)):
            lines.append(f"  {name}: done (complete JSON present; --force re-measures)")
            continue
        todo.append((kind, part, keys, name, out, part_shape))
    planned = []
    for i, (kind, part, keys, name, out, part_shape) in enumerate(todo):
        if i % slots != slot:
            lines.append(f"  {name}: slot {i % slots}/{slots}")
            continue
        if part not in catalog.PART_SHAPES:   # those keep their own shape's backend
            part_shape = dataclasses.replace(part_shape, backend=catalog.PART_BACKEND.get(part))
        part_precheck = precheck
        if part_shape.family != shape.family and hasattr(precheck, "keywords"):
            part_precheck = functools.partial(precheck.func, family=part_shape.family)
        try:
            if kind == "toggles":
                configs, values = suites.toggle_configs(
                    part_shape, catalog.select(part_shape, None, None, list(keys)),
                    part_precheck)
                extra = {"default_resolved": values, "part": part}
            else:
                configs = suites.peer_configs(part_shape, list(keys), part_precheck,
                                              availability)
                extra = {"part": part}
                if args.te:
                    _auto_needs_te(configs)
        except suites.SuiteError as err:
            lines.append(f"  {name}: cannot run here: {err}")
            continue
        if slots > 1:
            extra["concurrency"] = (f"slot {slot}/{slots}: ran beside {slots - 1} other "
                                    "benchmark process(es), each on its own GPU of this host")
        specs = sweep.order(configs, part_shape)
        # (--force measures anew: it never resumes)
        prior, kept = (_prior(name, out, configs, part_shape, specs, lines)
                       if args.resume and not args.force else (None, []))
        if prior is not None:
            specs = [s for s in specs if s.repeat not in kept]
            if not specs:
                lines.append(f"  {name}: every repeat is in the earlier JSON: nothing to measure")
                continue
        if not specs and args.te:   # not written: a session where TE runs measures it
            lines.append(f"  {name}: nothing to measure here: " + "; ".join(
                f"{c.id}: {c.status} {c.message}"[:200] for c in configs if not c.runnable))
            continue
        est = sum(plan.estimate(s, cal) for s in specs)
        planned.append((kind, name, out, configs, extra, specs, est, part_shape, prior))
        lines.append(f"  {name}: {len(specs)} runs, about {est:.0f} s")
    print(f"[bench all] {shape.gpus} GPU(s), slot {slot}/{slots}, budget {budget:.0f} s; "
          "parts in order:\n" + "\n".join(lines), flush=True)
    spent = 0.0
    for kind, name, out, configs, extra, specs, est, part_shape, prior in planned:
        fits = spent + est <= budget
        print(f"[bench all] {name}: {'runs now' if fits else 'left for a later session'} "
              f"(about {est:.0f} s)", flush=True)
        if not fits:
            continue  # a later, smaller part may still fit
        if args.plan:
            spent += est
            print(plan.format_plan(f"[{kind}] {name}", specs, _skipped(configs), cal, est))
            continue
        remaining = budget - (clock() - started)
        header = record.header(name)
        part_runner = (runner.for_part(name, part_shape.family) if hasattr(runner, "for_part")
                       else runner)
        result = suites.run_suite(kind, header, part_shape, configs, part_runner,
                                  lambda s: plan.estimate(s, cal), out, remaining, extra,
                                  prior=prior)
        print(table(result), flush=True)
        print(f"[bench all] wrote {out}" + ("" if result["complete"] else " (incomplete)"))
        spent = clock() - started
    return 0


def _prior(name: str, out: Path, configs, shape: BenchShape, specs, lines: list[str]
           ) -> tuple[dict | None, list[int]]:
    """--resume: the part's earlier JSON (this call's output folder first, then the committed
    one) and the repeats of `specs` it measured whole, when its plan is this one's but for the
    repeats; else (None, []), saying why."""
    for path in (out, record.BENCH_DIR / f"{name}.json"):
        try:
            prior = suites.saved_result(path)
        except RecordError as err:   # truncated or not a benchmark JSON: said, then replaced
            lines.append(f"  {name}: not resumed: {err}; measured anew")
            return None, []
        if prior is None:
            continue
        problem = sweep.resume_problem(prior, configs, shape, record.gpu_info().get("name"))
        if problem:
            lines.append(f"  {name}: not resumed from {path} ({problem}): measured anew")
            return None, []
        kept = sweep.whole_repeats(prior, specs)
        lines.append(f"  {name}: resumes {path}: repeat(s) {kept or 'none'} kept")
        return (prior, kept) if kept else (None, [])
    return None, []


def cmd_levers(args) -> int:
    from .levers import write_docs

    bench_dir = Path(args.bench_dir) if args.bench_dir else record.BENCH_DIR
    docs = Path(args.docs_dir) if args.docs_dir else REPO_ROOT / "docs"
    if not bench_dir.is_dir():
        return fail(f"--bench-dir {bench_dir}: no such folder (the benchmark JSONs are in docs/benchmarks)")
    doc = write_docs(bench_dir, docs)
    counts: dict[str, int] = {}
    for lever in doc["levers"]:
        counts[lever["effect"]["verdict"]] = counts.get(lever["effect"]["verdict"], 0) + 1
    print(f"wrote {docs / 'levers.json'}, {docs / 'levers.md'}, {docs / 'benchmarks.md'}: "
          f"{len(doc['levers'])} rows ({', '.join(f'{v} {k}' for k, v in counts.items())}) "
          f"from {len(doc['sources'])} JSON(s)")
    return 0


def cmd_readme(args) -> int:
    from .levers import build
    from .readme import NoMarkers, update_readme

    bench_dir = Path(args.bench_dir) if args.bench_dir else record.BENCH_DIR
    path = Path(args.readme)
    try:
        changed = update_readme(path, build(bench_dir), bench_dir)
    except (NoMarkers, OSError) as err:
        print(f"error: {path}: {err}", file=sys.stderr)
        return 2
    print(f"{path}: {'updated' if changed else 'already up to date'}")
    return 0


def cmd_table(args) -> int:
    try:
        data = read_json(args.json, "benchmark JSON")
    except BadFile as err:
        return fail(str(err))
    if not isinstance(data, dict) or data.get("kind") not in TABLE_KINDS:
        return fail(f"{args.json}: not a benchmark JSON (its kind is none of {', '.join(TABLE_KINDS)}); "
                    "give one of docs/benchmarks/*.json")
    try:
        validate(data, BenchResult, args.json)
        text = table(data)
    except RecordError as err:
        return fail(str(err))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return fail(f"{args.json}: an incomplete benchmark JSON ({type(err).__name__}: {err}); "
                    "regenerate it with python -m training.bench")
    print(text)
    return 0


def _shape_args(p: argparse.ArgumentParser) -> None:
    """The shape options; their defaults are BenchShape's, filled in by _shape (None here tells
    an option given on the command line from a default: `bench all` passes the given run counts
    to the parts with their own shape)."""
    d = BenchShape()
    g = p.add_argument_group("shape")
    g.add_argument("--model-size", help=f"MODEL_SIZE of the llama3 family (default {d.model_size})")
    g.add_argument("--num-layers", type=positive_int, help=f"default {d.num_layers}")
    g.add_argument("--seq-length", type=positive_int, help=f"default {d.seq_length}")
    g.add_argument("--mbs", type=positive_int, help=f"default {d.mbs}")
    g.add_argument("--global-batch", type=positive_int, help=f"default {d.global_batch}")
    g.add_argument("--gpus", type=positive_int, help=f"GPUS_PER_NODE (default {d.gpus})")
    g.add_argument("--tp", type=positive_int, help=f"default {d.tp}")
    g.add_argument("--pp", type=positive_int, help=f"default {d.pp}")
    g.add_argument("--steps", type=positive_int,
                   help=f"steady-state steps per run (default {d.steps})")
    g.add_argument("--warmup", type=nonnegative_int,
                   help=f"warm-up steps per run, not measured (default {d.warmup})")
    g.add_argument("--repeats", type=positive_int, help=f"default {d.repeats}")
    r = p.add_argument_group("run")
    r.add_argument("--plan", action="store_true", help="print the runs and estimates; run nothing")
    r.add_argument("--budget-s", type=positive_float, default=None,
                   help="stop before a run that would end past this many seconds")
    r.add_argument("--work-dir", default=None, help="run folders and logs (default: a temp dir)")
    r.add_argument("--timeout-s", type=positive_float, default=600, help="per-run limit")
    r.add_argument("--master-port", type=positive_int, default=29500)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.bench",
                            description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("toggles", help="default run vs each lever's variant")
    _shape_args(t)
    t.add_argument("--only", default=None, help="default-on toggles to measure (default: all five)")
    t.add_argument("--levers", default=None,
                   help=f"lever groups: {','.join(catalog.GROUPS)}, all or none "
                        "(default: precision)")
    t.add_argument("--keys", default=None, help="explicit lever keys (replaces --only/--levers); "
                   "'default': the launcher default alone")
    t.add_argument("--name", default=None)
    t.add_argument("--out", default=None)
    t.set_defaults(fn=cmd_toggles)

    p = sub.add_parser("peers", help="ours vs Megatron local vs HF (+Liger) vs torchtitan")
    _shape_args(p)
    p.add_argument("--sides", default="native,hf,hf_liger,torchtitan,local",
                   help="the first is ours, compared with each other side")
    p.add_argument("--ours-env", default=None,
                   help="launcher toggles for our sides on top of the default, e.g. "
                        "ADAM_MOMENTS_DTYPE=bf16,MASTER_WEIGHTS=remainder")
    p.add_argument("--name", default=None)
    p.add_argument("--out", default=None)
    p.set_defaults(fn=cmd_peers)

    a = sub.add_parser("all", help="every part for this GPU count that fits the budget")
    _shape_args(a)
    a.set_defaults(budget_s=510.0)
    a.add_argument("--out-dir", default=None, help="where the JSONs go (default docs/benchmarks)")
    a.add_argument("--force", action="store_true", help="re-measure parts already complete")
    a.add_argument("--resume", action="store_true",
                   help="extend a part's earlier JSON (the output folder's, else the committed "
                        "one) of the same plan: keep its whole repeats, measure the others "
                        "(e.g. a 1-repeat JSON to the part's 2 repeats in a later call)")
    a.add_argument("--parts", default=None,
                   help="comma-separated part names to consider (default: every part, in order)")
    a.add_argument("--te", action="store_true",
                   help="the Transformer Engine parts (peers-te, te-recipes, te-toggles-a/-b; "
                        "one GPU, where TE imports) instead of the others")
    a.add_argument("--slot", default="0/1", type=_slot,
                   help="K/N: take every Nth part not yet done, from the Kth (run N of these "
                        "side by side, each with its own CUDA_VISIBLE_DEVICES and --master-port)")
    a.set_defaults(fn=cmd_all)

    lv = sub.add_parser("levers", help="regenerate docs/levers.{json,md} and docs/benchmarks.md")
    lv.add_argument("--bench-dir", default=None)
    lv.add_argument("--docs-dir", default=None)
    lv.set_defaults(fn=cmd_levers)

    rd = sub.add_parser("readme", help="regenerate docs/results.md's perf-table block")
    rd.add_argument("--readme", default=str(REPO_ROOT / "docs" / "results.md"),
                    help="the page with the perf-table block (default: docs/results.md)")
    rd.add_argument("--bench-dir", default=None)
    rd.set_defaults(fn=cmd_readme)

    tb = sub.add_parser("table", help="markdown table of a benchmark JSON")
    tb.add_argument("json")
    tb.set_defaults(fn=cmd_table)

    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
