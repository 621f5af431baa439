"""The three suites: `toggles` (a default run and its lever variants), `peers` (ours and the
other trainers) and `all` (the named parts of both, within a wall-time budget).

Everything that can be decided before a GPU is used is decided here: a guard's refusal or
correction (through the launcher's own resolve), a peer that cannot run on this machine.
Such configs are recorded with their reason and cost no run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from training.reading import RecordError, read_json
from training.records import BenchResult, validate

from . import sweep
from .catalog import OURS_PEERS, OURS_PEERS_TAKE_OURS_ENV, PEER_SIDES, Lever
from .ours import NotRunnable
from .shape import BenchShape
from .sweep import Config

OURS_SIDES = ("native", "local", "transformer_engine", "auto")
Precheck = Callable[[dict], dict]
Availability = Callable[[str], "str | None"]


class SuiteError(Exception):
    """The suite cannot start (its default run is refused, a bad selection, ...)."""


def toggle_configs(shape: BenchShape, levers: list[Lever], precheck: Precheck
                   ) -> tuple[list[Config], dict]:
    """The default config and one per lever, each prechecked; also the default's values."""
    base = precheck(shape.env())
    if base["status"] != "ok":
        raise SuiteError(f"the default run itself is refused here: {base['message']}")
    default_values = base["values"]
    default_fixes = {(c["toggle"], c["value"]) for c in base["corrections"]}
    configs = [Config("default", "ours", {}, None, corrections=base["corrections"])]
    for lever in levers:
        lever_dict = {"key": lever.key, "id": lever.id, "kind": lever.kind,
                      "set": lever.set, "baseline": lever.baseline,
                      "default_is_set": lever.default_is_set, "needs_dp": lever.needs_dp,
                      "needs_backend": lever.needs_backend, "note": lever.note,
                      "over": lever.over}
        config = Config(lever.key, "ours", dict(lever.env), lever_dict)
        configs.append(config)
        same = [k for k, v in lever.env.items() if default_values.get(k) == v]
        if same:
            config.status = "not applicable"
            config.message = (f"{', '.join(f'{k}={lever.env[k]}' for k in same)} is already "
                              "the default here")
            continue
        if lever.needs_backend and default_values.get("TRANSFORMER_IMPL") != lever.needs_backend:
            config.status = "not applicable"
            config.message = (f"acts on the {lever.needs_backend} backend; the default backend "
                              f"here is {default_values.get('TRANSFORMER_IMPL')}")
            continue
        check = precheck({**shape.env(), **lever.env})
        if check["status"] != "ok":
            config.status, config.message = "refused", check["message"]
            continue
        changed = [c for c in check["corrections"] if c["toggle"] in lever.env]
        if changed:
            config.status = "refused"
            config.message = "corrected by a guard: " + "; ".join(
                f"{c['toggle']} -> {c['value']} ({c['reason']})" for c in changed)
            continue
        config.corrections = [c for c in check["corrections"]
                              if (c["toggle"], c["value"]) not in default_fixes]
    return configs, default_values


def peer_configs(shape: BenchShape, sides: list[str], precheck: Precheck,
                 availability: Availability, ours_env: dict[str, str] | None = None
                 ) -> list[Config]:
    """ours_env: launcher toggles every side of ours runs with on top of the default (e.g.
    the optimizer state the pre-flight recommends for a shape whose default does not fit)."""
    if not sides or sides[0] not in OURS_SIDES:
        raise SuiteError(f"the first side is ours (one of {', '.join(OURS_SIDES)}), the one "
                         "every other side is compared with")
    unknown = [s for s in sides if s not in PEER_SIDES and s not in OURS_SIDES]
    if unknown:
        raise SuiteError(f"unknown side(s) {', '.join(unknown)}: use "
                         f"{', '.join(PEER_SIDES)}")
    if shape.gpus != 1 and any(s not in OURS_SIDES for s in sides):
        raise SuiteError("the HF and torchtitan peers run on one GPU: use --gpus 1")
    configs = []
    for side in sides:
        if side in OURS_SIDES or side in OURS_PEERS:
            # a peer that is our launcher (Megatron-LM with TE at its own defaults) takes its
            # own toggles; our sides take ours_env on top of the default
            try:
                env = (OURS_PEERS[side]() if side in OURS_PEERS else
                       {} if side == "auto" else {"TRANSFORMER_IMPL": side})
                if side not in OURS_PEERS or side in OURS_PEERS_TAKE_OURS_ENV:
                    env = {**(ours_env or {}), **env}
            except NotRunnable as err:
                config = Config(side, "ours", {}, status="not runnable", message=str(err))
                configs.append(config)
                continue
            config = Config(side, "ours", env)
            check = precheck({**shape.env(), **env})
            if check["status"] != "ok":
                config.status, config.message = "refused", check["message"]
            elif side == sides[0]:
                config.corrections = check["corrections"]
        else:
            config = Config(side, side)
            reason = availability(side)
            if reason:
                config.status, config.message = "not runnable", reason
        configs.append(config)
    if configs[0].status != "planned":
        raise SuiteError(f"ours ({sides[0]}) is refused here: {configs[0].message}")
    others = [c for c in configs[1:] if c.side != "ours" or c.id in OURS_PEERS]
    if others and not any(c.status == "planned" for c in others):
        configs[0].status = "not run"
        configs[0].message = ("no runnable peer to compare with: "
                              + "; ".join(f"{c.id}: {c.status}" for c in others))
    return configs


def run_suite(kind: str, header: dict, shape: BenchShape, configs: list[Config],
              runner: sweep.Runner, estimate: sweep.Estimate, out: Path, budget_s: float,
              extra: dict | None = None, log: Callable[[str], None] = print,
              prior: dict | None = None) -> dict:
    result = dict(header)
    result.update(kind=kind, shape={**shape.to_dict(), "note": shape_note(shape)},
                  **(extra or {}))
    from .stats import VERDICT_RULE

    result["verdict_rule"] = VERDICT_RULE
    return sweep.run(result, configs, shape, runner, estimate, out, budget_s, log=log,
                     prior=prior)


def shape_note(shape: BenchShape) -> str:
    return (f"{shape.steps} steady-state steps after {shape.warmup} warm-up per run, "
            f"{shape.repeats} repeats; global batch {shape.global_batch} "
            f"({shape.microbatches} micro-batches per GPU per step)")


def is_complete(path: Path, repeats: int | None = None) -> bool:
    """A part's JSON exists and its plan ran to the end (with `repeats`: at least that many)."""
    try:
        data = saved_result(path)
    except RecordError:
        return False
    return bool(data and data.get("complete")) and (
        repeats is None or (data.get("shape") or {}).get("repeats", 1) >= repeats)


def saved_result(path: Path) -> dict | None:
    """A benchmark JSON (training.records.BenchResult), or None where there is none;
    RecordError saying why one that is there cannot be used."""
    if not path.exists():
        return None
    data = read_json(path, "benchmark JSON")
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not a benchmark JSON (a JSON object)")
    validate(data, BenchResult, path)
    return data
