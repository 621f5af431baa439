"""The reference table the projection's efficiency is fitted to, and its leave-one-out check.

    python -m training.optimize.references [--json] [--write] [--references FILE]

docs/scale/references.json holds every reference once, with its source (the page or file, the
table and row, the date, the container): a published tokens/s/GPU copied as published, or one
of our runs read from the benchmark JSON it names (never typed). Each is resolved by the
launcher (its `words`), its implied efficiency found (training/optimize/efficiency.py: the
compute time that makes the projected step equal the reference's), and the efficiency model
fitted to all of them (`model()`, what python -m training.optimize.project uses).

The check keeps the fit and the test apart: every reference is projected by a model fitted
without it, and without every other row of the same setup (the same figure republished by a
later release would otherwise leak it back): leave-one-setup-out. The table shows that
predictive error, and each class's errors (dense or MoE, by precision) make the band printed
with every projection. --write regenerates docs/scale/references.md (never typed by hand).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from training import REPO_ROOT
from training.cli import ArgumentParser
from training.reading import RecordError, read_json
from training.records import BenchResult, validate

from . import efficiency
from .inputs import BadInput

REFERENCES = Path("docs/scale/references.json")
TABLE = Path("docs/scale/references.md")
BAR_PCT = 15.0       # the bar for the projection's error on each reference
MIN_CLASS = 3        # fewer references than this in a class: its band is the whole table's
# The backend a published row ran on: the published Megatron recipes here (Megatron-Bridge,
# NeMo, MLPerf, AMD's Primus) train on Transformer Engine's layers (its ROCm port on AMD). A
# published row is resolved there, not on the backend this launcher's auto picks for the words
# (gpt-oss at bf16: native, by the launcher's own numerics rule), so that `native` stays what
# it says: our backend, in our measured runs (whose words name it).
PUBLISHED_BACKEND = "transformer_engine"


def measured_figure(root: Path, spec: dict[str, str]) -> tuple[float, str]:
    """(tokens/s/GPU, the date it was recorded) of one point of a recorded benchmark JSON."""
    path = root / spec["file"]
    doc = read_json(path, "recorded benchmark")
    if not isinstance(doc, dict):
        raise RecordError(f"{path}: not a benchmark JSON (a JSON object)")
    validate(doc, BenchResult, path)
    for index, point in enumerate(doc.get("points") or []):
        if isinstance(point, dict) and point.get("label") == spec["point"]:
            figure = (point.get("summary") or {}).get("tokens_per_s_per_gpu") \
                if isinstance(point.get("summary"), dict) else None
            if isinstance(figure, bool) or not isinstance(figure, (int, float)) \
                    or not math.isfinite(figure) or figure <= 0:
                raise RecordError(f"{path}: points.{index}.summary.tokens_per_s_per_gpu: must be "
                                  f"a positive number (got {figure!r})")
            return float(figure), str(doc.get("created", ""))[:10]
    raise BadInput(f"{path}: no point labelled {spec['point']!r}")


def software_date(ref: dict[str, Any], recorded: str = "") -> str:
    """The date of the software a reference ran: its own `software` date, else its container's
    YY.MM (NeMo containers are named by year and month), else the date our run was recorded."""
    if ref.get("software"):
        return str(ref["software"])
    container = str(ref.get("container", ""))
    if ":" in container:
        yy, mm = container.split(":", 1)[1].split(".")[:2]
        return f"20{int(yy):02d}-{int(mm):02d}-01"
    if recorded:
        return recorded
    raise BadInput(f"reference {ref.get('id')}: no container and no recorded date")


def precision_group(precision: str) -> str:
    if precision in efficiency.FP8:
        return "fp8"
    if precision in efficiency.FP4:
        return "fp4"
    return precision


def class_of(run) -> str:
    """The class a projection's band is taken from: dense or MoE, by precision."""
    return f"{'moe' if run.model.moe else 'dense'} {precision_group(run.precision)}"


@dataclass(frozen=True)
class Reference:
    id: str
    ref: dict[str, Any]           # the JSON entry
    run: Any                      # the resolved RunDescription
    vpp: int | None
    tokens_per_s_per_gpu: float
    software: str                 # ISO date of its software
    group: str                    # its setup (words and VPP): one group across releases
    klass: str

    @property
    def step_s(self) -> float:
        lay = self.run.layout
        return lay.global_batch * self.run.model.seq_length / lay.world_size \
            / self.tokens_per_s_per_gpu


@dataclass(frozen=True)
class Band:
    name: str
    low_pct: float       # the smallest leave-one-out error of the class (projected/ref - 1)
    high_pct: float      # the largest
    count: int
    how: str


@dataclass(frozen=True)
class Model:
    """The fitted efficiency and the error bands."""
    fit: efficiency.Fit
    bands: dict[str, Band] = field(default_factory=dict)

    def band(self, run, uninformed: bool = False) -> Band:
        """The band of the run's class; the whole table's where the class has too few
        references or the run has a feature no reference informs (an AMD GPU, say)."""
        name = class_of(run)
        if name in self.bands and not uninformed:
            return self.bands[name]
        if "all" in self.bands:
            return self.bands["all"]
        return Band(name, 0.0, 0.0, 0, "no leave-one-out check behind this model")


def check_entry(file: Path, n: int, ref: Any) -> None:
    """One reference's fields, or a BadInput naming the entry and what to write."""
    where = f"{file}: references[{n}]"
    if not isinstance(ref, dict):
        raise BadInput(f"{where} is not an object")
    where += f" ({ref.get('id', 'no id')})"
    for key in ("id", "family", "source", "setup"):
        if not isinstance(ref.get(key), str) or not ref[key].strip():
            raise BadInput(f"{where}: '{key}' must be a non-empty string")
    words = ref.get("words")
    if not isinstance(words, list) or not all(isinstance(w, str) and "=" in w for w in words):
        raise BadInput(f"{where}: 'words' must be a list of KEY=VALUE strings")
    measured = ref.get("measured")
    if measured is not None:
        if not (isinstance(measured, dict) and isinstance(measured.get("file"), str)
                and isinstance(measured.get("point"), str)):
            raise BadInput(f"{where}: 'measured' needs 'file' and 'point' strings")
        return
    figure = ref.get("tokens_per_s_per_gpu")
    if isinstance(figure, bool) or not isinstance(figure, (int, float)) or not figure > 0:
        raise BadInput(f"{where}: 'tokens_per_s_per_gpu' must be a positive number (or name "
                       "the benchmark JSON it is read from under 'measured')")
    vpp = ref.get("vpp")
    if vpp is not None and (isinstance(vpp, bool) or not isinstance(vpp, int) or vpp < 1):
        raise BadInput(f"{where}: 'vpp' must be a whole number >= 1")


def launch_words(ref: dict[str, Any]) -> list[str]:
    """The words a reference is resolved with: its own, and for a published row that names no
    backend, the backend its recipe runs on (PUBLISHED_BACKEND)."""
    words = list(ref["words"])
    if "measured" not in ref and not any(w.startswith("TRANSFORMER_IMPL=") for w in words):
        words.append(f"TRANSFORMER_IMPL={PUBLISHED_BACKEND}")
    return words


def load(root: Path = REPO_ROOT, path: Path | None = None) -> list[Reference]:
    from .project import resolve_run, vpp_of

    file = root / (path or REFERENCES)
    doc = read_json(file, "references JSON")
    refs = doc.get("references") if isinstance(doc, dict) else None
    if not isinstance(refs, list) or not refs:
        raise BadInput(f"{file}: no 'references' list")
    out = []
    for n, ref in enumerate(refs):
        check_entry(file, n, ref)
        if "measured" in ref:
            tokens, recorded = measured_figure(root, ref["measured"])
        else:
            tokens, recorded = float(ref["tokens_per_s_per_gpu"]), ""
        run = resolve_run(ref["family"], launch_words(ref), environ={})
        vpp = ref.get("vpp") or vpp_of(run)
        group = " ".join(sorted(ref["words"])) + f" family={ref['family']} vpp={vpp}"
        out.append(Reference(ref["id"], ref, run, vpp, tokens, software_date(ref, recorded),
                             group, class_of(run)))
    return out


def sample(r: Reference) -> efficiency.Sample:
    """The reference's features and log(implied efficiency)."""
    from training.metrics import flops_per_token

    from .project import _platform, compute_peak, implied_compute, recompute_factor

    run = r.run
    lay = run.layout
    compute = implied_compute(run, r.step_s, r.vpp)
    flops = flops_per_token(run.model) * lay.global_batch * run.model.seq_length \
        / lay.world_size * recompute_factor(run)[0]
    peak = compute_peak(run, _platform(run))[0] * 1e12
    implied = flops / (peak * compute) if compute > 0 else efficiency.MAX_EFFICIENCY
    implied = min(implied, efficiency.MAX_EFFICIENCY)
    return efficiency.Sample(r.id, efficiency.features(run), math.log(implied),
                             r.group)


# precision coefficients measured on pairs: the same setup (words, VPP, release) published in
# both recipes, so the layout, the links and the software cancel: {feature: (recipe, against)}
PAIRED = {"mxfp8": ("mxfp8", "fp8_tensorwise")}


def pairs(refs: list[Reference], samples: list[efficiency.Sample], feature: str,
          without: str | None = None) -> list[tuple[str, str, float]]:
    """(id, id of its pair, log of the efficiency ratio) for the feature's recipe pairs, leaving
    out pairs with a reference of setup group `without`."""
    recipe, against = PAIRED[feature]
    log_e = {s.id: s.log_efficiency for s in samples}

    def key(r: Reference) -> tuple:
        words = tuple(sorted(w for w in r.ref["words"] if not w.startswith("PRECISION=")))
        return r.ref["family"], words, r.vpp, r.software

    base = {key(r): r for r in refs if r.run.precision == against and r.group != without}
    return [(r.id, base[key(r)].id, log_e[r.id] - log_e[base[key(r)].id]) for r in refs
            if r.run.precision == recipe and r.group != without and key(r) in base]


def paired(refs: list[Reference], samples: list[efficiency.Sample],
           without: str | None = None) -> dict[str, float]:
    """The precision coefficients measured on pairs (their mean log efficiency ratio)."""
    out = {}
    for feature in PAIRED:
        found = pairs(refs, samples, feature, without)
        if found:
            out[feature] = sum(d for _, _, d in found) / len(found)
    return out


def leave_one_out(refs: list[Reference], samples: list[efficiency.Sample],
                  ridge: float = efficiency.RIDGE) -> list[dict[str, Any]]:
    """Each reference projected by a model fitted without its setup's rows (and without the
    recipe pairs they are part of)."""
    from .project import project

    rows = []
    fits: dict[str, efficiency.Fit] = {}
    for r in refs:
        if r.group not in fits:
            fits[r.group] = efficiency.fit([s for s in samples if s.group != r.group], ridge,
                                           fixed=paired(refs, samples, without=r.group))
        held_out = Model(fits[r.group])
        result = project(r.run, vpp=r.vpp, model=held_out)
        projected = result["tokens_per_s_per_gpu"]
        error = 100.0 * (projected / r.tokens_per_s_per_gpu - 1.0)
        rows.append({"id": r.id, "source": r.ref["source"], "setup": r.ref["setup"],
                     "words": r.ref["words"], "vpp": r.vpp, "class": r.klass,
                     "software": r.software,
                     "reference_tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                     "reference_from": r.ref.get("measured", {}).get("file", "published"),
                     "projected_tokens_per_s_per_gpu": projected,
                     "efficiency": result["efficiency"],
                     "implied_efficiency": math.exp(
                         next(s.log_efficiency for s in samples if s.id == r.id)),
                     "error_pct": error, "within_bar": abs(error) <= BAR_PCT,
                     "exposed_comm_s": result["exposed_comm_s"], "step_s": result["step_s"],
                     "memory_fits": result["memory"]["fits"],
                     "notes": list(getattr(r.run, "projection_notes", ()))})
    return rows


def bands(rows: list[dict[str, Any]]) -> dict[str, Band]:
    """Per class, the range of its leave-one-out errors; 'all': the whole table's."""
    out = {}
    classes = sorted({r["class"] for r in rows})
    for name in classes + ["all"]:
        errors = [r["error_pct"] for r in rows if name in ("all", r["class"])]
        if name != "all" and len(errors) < MIN_CLASS:
            continue
        inside = sum(abs(e) <= BAR_PCT for e in errors)
        out[name] = Band(name, min(errors), max(errors), len(errors),
                         f"leave-one-out errors of the {len(errors)} '{name}' references "
                         f"(docs/scale/references.md): {min(errors):+.1f}% to "
                         f"{max(errors):+.1f}%, {inside} of them within {BAR_PCT:.0f}%")
    return out


@lru_cache(maxsize=4)
def _build(root: Path, path: Path | None) -> tuple[Model, tuple[dict[str, Any], ...]]:
    refs = load(root, path)
    samples = [sample(r) for r in refs]
    rows = leave_one_out(refs, samples)
    model = Model(efficiency.fit(samples, fixed=paired(refs, samples)), bands(rows))
    return model, tuple(rows)


def model(root: Path = REPO_ROOT, path: Path | None = None) -> Model:
    """The efficiency fitted to every reference, with the leave-one-out bands."""
    return _build(root, path)[0]


def check(root: Path = REPO_ROOT, path: Path | None = None) -> list[dict[str, Any]]:
    """The leave-one-out rows of the reference table."""
    return [dict(r) for r in _build(root, path)[1]]


def markdown(rows: list[dict[str, Any]], fitted: Model | None = None) -> str:
    fitted = fitted or model()
    inside = sum(r["within_bar"] for r in rows)
    within25 = sum(abs(r["error_pct"]) <= 25 for r in rows)
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    lines = ["<!-- generated by python -m training.optimize.references --write; do not edit -->",
             "# The projection against published and recorded figures", "",
             "Error = projected tokens/s/GPU over the reference, minus one, where the projection "
             "of each row comes from an efficiency model fitted **without** that row and every "
             "other row of the same setup (leave-one-setup-out: predictive error, not fit "
             f"error). Bar: {BAR_PCT:.0f}%. Sources, one per row: docs/scale/references.json.",
             "", f"**{inside} of {len(rows)} references within {BAR_PCT:.0f}%, {within25} "
             f"within 25%; the largest error is {worst['error_pct']:+.1f}% ({worst['id']}).**",
             "", "## Bands (shown with every projection)", "",
             "| class | references | leave-one-out errors |", "|---|---|---|"]
    for name, band in sorted(fitted.bands.items()):
        lines.append(f"| {name} | {band.count} | {band.low_pct:+.1f}% to {band.high_pct:+.1f}% |")
    lines += ["", "## The fitted efficiency (all references)", "",
              f"log(efficiency) = sum of coefficient x feature (ridge {fitted.fit.ridge:g}; "
              f"training/optimize/efficiency.py says what each feature is); residual RMS "
              f"{fitted.fit.residual_rms:.3f}.", "", "| feature | coefficient |", "|---|---|"]
    for name, value in fitted.fit.coefficients.items():
        if name in fitted.fit.informed:
            lines.append(f"| {name} | {value:+.4f} |")
    lines += ["", "## Every reference", "",
              "| reference | class | setup | software | reference tokens/s/GPU | projected "
              "(left out) | error | exposed comm | source |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        miss = "" if r["within_bar"] else " **outside the bar**"
        note = " (launcher refuses it; projected as published)" if r["notes"] else ""
        lines.append(f"| {r['id']} | {r['class']} | {r['setup']}{note} | {r['software'][:7]} | "
                     f"{r['reference_tokens_per_s_per_gpu']:,.0f} | "
                     f"{r['projected_tokens_per_s_per_gpu']:,.0f} | {r['error_pct']:+.1f}%{miss} | "
                     f"{r['exposed_comm_s'] / r['step_s']:.1%} of the step | {r['source']} |")
    return "\n".join(lines) + "\n"


def _rows(args) -> list[dict[str, Any]]:
    path = Path(args.references) if args.references else None
    rows = check(path=path)
    if args.write:
        (REPO_ROOT / TABLE).write_text(markdown(rows, model(path=path)))
    return rows


def main(argv: list[str] | None = None) -> int:
    from .project import run_cli

    parser = ArgumentParser(prog="python -m training.optimize.references",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help=f"regenerate {TABLE}")
    parser.add_argument("--references", default=None, help=f"another references file "
                                                           f"(default: {REFERENCES})")
    paths: list[Path | None] = []

    def rows(args):
        paths.append(Path(args.references) if args.references else None)
        return _rows(args)
    return run_cli(parser, argv, rows, lambda r: markdown(r, model(path=paths[-1])))


if __name__ == "__main__":
    sys.exit(main())
