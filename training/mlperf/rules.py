"""The llama31_8b rules (examples/mlperf/llama31_8b/config.yaml) and the arithmetic around them.

Three users:
  - the recipe layer (training/mlperf/layer.py): the recipe's values for every knob the user
    left unset, and its guard mlperf_closed_rules: `findings()` on a resolved launch;
  - the run (training.mlperf.events): the evaluation cadence it logs.

Evaluation cadence, in sequences -> Megatron iterations (the reference rounds up the same way):
    EVAL_INTERVAL = ceil(MLPERF_EVAL_EVERY / BS)      12288 / 32 = 384 iterations
    EVAL_ITERS    = ceil(MLPERF_EVAL_SAMPLES / BS)    1024 / 32  = 32 batches
so every evaluation reads EVAL_ITERS * BS >= MLPERF_EVAL_SAMPLES sequences: the first ones of
the validation set, in file order, the same ones each time (training/mlperf/valid_data.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training import REPO_ROOT
from training.reading import read_yaml

CONFIG = REPO_ROOT / "examples" / "mlperf" / "llama31_8b" / "config.yaml"
# each benchmark's config.yaml (the recipe: training.mlperf.launch --benchmark NAME)
CONFIGS = {"llama31_8b": CONFIG,
           "gpt_oss_20b": REPO_ROOT / "examples" / "mlperf" / "gpt_oss_20b" / "config.yaml"}


@dataclass(frozen=True)
class Rules:
    benchmark: str
    ruleset: str
    model: dict[str, Any]
    closed: dict[str, Any]
    min_lr_ratio: float
    dropout: float
    free: dict[str, Any]
    path: Path = field(default=CONFIG)
    reference_data: dict[str, Any] = field(default_factory=dict)
    family: str = "llama3"                              # the launcher's model family
    model_name: str = "Llama 3.1 8B"                    # in the MODEL_SIZE row's reason
    script: str = "examples/mlperf/llama31_8b/run_llama31_8b.sh"   # the entry point

    @property
    def script_name(self) -> str:
        return Path(self.script).name

    @property
    def config_filename(self) -> str:
        try:
            return str(self.path.resolve().relative_to(REPO_ROOT))
        except ValueError:
            return str(self.path)


def load(path: Path = CONFIG) -> Rules:
    data = read_yaml(path, "MLPerf rules")
    own = {k: str(data[k]) for k in ("family", "model_name", "script") if k in data}
    return Rules(benchmark=data["benchmark"], ruleset=str(data["ruleset"]),
                 model=dict(data["model"]), closed=dict(data["closed"]),
                 min_lr_ratio=float(data["min_lr_ratio"]), dropout=float(data["dropout"]),
                 free=dict(data["free"]), path=Path(path),
                 reference_data=dict(data.get("reference_data") or {}), **own)


def load_benchmark(name: str) -> Rules:
    """The rules of a benchmark this project has a recipe for (CONFIGS)."""
    if name not in CONFIGS:
        raise KeyError(f"no MLPerf recipe for {name!r}: use one of {', '.join(CONFIGS)}")
    return load(CONFIGS[name])


# -- cadence arithmetic ------------------------------------------------------------------------

def eval_interval(every_sequences: int, global_batch: int) -> int:
    """Iterations between evaluations: at least every `every_sequences` training sequences."""
    return math.ceil(every_sequences / global_batch)


def eval_iters(eval_sequences: int, global_batch: int) -> int:
    """Batches per evaluation: at least `eval_sequences` validation sequences."""
    return math.ceil(eval_sequences / global_batch)


def evaluated_sequences(eval_sequences: int, global_batch: int) -> int:
    """What each evaluation really reads: whole batches, the first ones of the valid set."""
    return eval_iters(eval_sequences, global_batch) * global_batch


def warmup_iters(warmup_samples: int, global_batch: int) -> int:
    return math.ceil(warmup_samples / global_batch)


def min_lr(rules: Rules, lr: float) -> float:
    return float(f"{rules.min_lr_ratio * lr:.6g}")


# -- checks on a resolved launch -------------------------------------------------------------

@dataclass
class Findings:
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return str(a) == str(b)


def _fmt(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def rule_breaks(values: dict[str, Any], rules: Rules) -> list[str]:
    """Each closed-division rule the values break, as 'NAME=value (rule: ...)'."""
    breaks = []
    for name, want in {**rules.model, **rules.closed}.items():
        if not _same(values.get(name), want):
            breaks.append(f"{name}={_fmt(values.get(name))} (rule: {_fmt(want)})")
    lr, got = values.get("LR"), values.get("MIN_LR")
    if lr is not None and not _same(got, min_lr(rules, lr)):
        breaks.append(f"MIN_LR={_fmt(got)} (rule: {rules.min_lr_ratio:g} x LR = "
                      f"{_fmt(min_lr(rules, lr))})")
    return breaks


def _one_prefix(value: str | None) -> bool:
    from training.data.check import parse_data_path

    return value is None or len(parse_data_path(value)) == 1


def findings(settings, rules: Rules | None = None) -> Findings:
    """What the guard mlperf_closed_rules says about a launch of the recipe."""
    rules = rules or load()
    out = Findings()
    values = {name: setting.value for name, setting in settings.values.items()}
    division = values["MLPERF_DIVISION"]
    bs = values["BS"]

    breaks = rule_breaks(values, rules)
    if breaks and division == "closed":
        out.refusals.append(
            f"MLPERF_DIVISION=closed, but {rules.benchmark}'s closed rules are broken: "
            f"{'; '.join(breaks)}. Leave these unset ({rules.script_name} sets the rule values; "
            f"{rules.config_filename} lists them), or set MLPERF_DIVISION=open.")
    elif breaks:
        out.warnings.append(f"MLPERF_DIVISION=open: differs from the closed rules: "
                            f"{'; '.join(breaks)}.")
    # a DRY_RUN for a named platform (another machine's launch) may leave that machine's data out
    dataless = not (values.get("DATA_PATH") or values.get("VALID_DATA_PATH"))
    elsewhere = values.get("DRY_RUN") and values.get("PLATFORM") not in (None, "auto")
    if division == "closed" and dataless and elsewhere:
        out.warnings.append(
            f"DRY_RUN=1 for PLATFORM={values['PLATFORM']} without DATA_PATH and "
            "VALID_DATA_PATH: the closed launch is resolved on Megatron's mock data; a closed "
            "run needs the C4 training and validation sets (docs/mlperf.md: data preparation).")
    elif division == "closed" and not (values.get("DATA_PATH") and values.get("VALID_DATA_PATH")):
        out.refusals.append(
            "MLPERF_DIVISION=closed needs the C4 training set in DATA_PATH and the C4 validation "
            "set in VALID_DATA_PATH (docs/mlperf.md: data preparation); mock data or a SPLIT of "
            "the training set is open division only.")

    # The run derives its evaluation from these: they must agree in either division.
    every, samples = values["MLPERF_EVAL_EVERY"], values["MLPERF_EVAL_SAMPLES"]
    target = values["MLPERF_TARGET_LOSS"]
    unset = [n for n, v in (("MLPERF_EVAL_EVERY", every), ("MLPERF_EVAL_SAMPLES", samples),
                            ("MLPERF_TARGET_LOSS", target)) if v is None]
    if unset:
        out.refusals.append(f"an MLPerf run needs {', '.join(unset)} ({rules.script_name} sets "
                            f"them from {rules.config_filename}).")
    elif every < 1 or samples < 1:
        out.refusals.append(f"MLPERF_EVAL_EVERY={every} and MLPERF_EVAL_SAMPLES={samples} must "
                            "be at least 1.")
    else:
        expected = {"EVAL_INTERVAL": eval_interval(every, bs), "EVAL_ITERS": eval_iters(samples, bs)}
        wrong = [f"{k}={values[k]} (ceil({every if k == 'EVAL_INTERVAL' else samples}/BS {bs}) "
                 f"= {v})" for k, v in expected.items() if values[k] != v]
        if wrong:
            out.refusals.append(
                f"an MLPerf run evaluates every MLPERF_EVAL_EVERY={every} training sequences on "
                f"the first MLPERF_EVAL_SAMPLES={samples} validation sequences, but "
                f"{'; '.join(wrong)}. Set MLPERF_EVAL_EVERY / MLPERF_EVAL_SAMPLES instead and "
                "leave EVAL_INTERVAL / EVAL_ITERS unset (the recipe derives them).")
    if target is not None and not target > 0:
        out.refusals.append(f"MLPERF_TARGET_LOSS={target:g} must be above 0.")
    valid_set = values.get("VALID_DATA_PATH") or values.get("DATA_PATH")
    if not _one_prefix(valid_set):
        out.refusals.append(
            f"the validation set {valid_set!r} is a blend: an MLPerf evaluation reads the first "
            "sequences of ONE validation set in file order. Give VALID_DATA_PATH one prefix.")
    elif values.get("VALID_DATA_PATH") and values.get("EVAL_ITERS"):
        short = _too_few_sequences(values)
        if short:
            out.refusals.append(short)
    return out


def _too_few_sequences(values: dict[str, Any]) -> str | None:
    """The validation set must hold what one evaluation reads (EVAL_ITERS x BS sequences of
    SEQ_LENGTH + 1 tokens, consecutive ones sharing a token, as Megatron cuts them)."""
    from training.data.check import DataPathError, check_data_path

    try:
        info = check_data_path(values["VALID_DATA_PATH"], values.get("TOKENIZER_MODEL"))
    except DataPathError:
        return None  # the data_path guard says what is wrong with it
    seq, needed = values["SEQ_LENGTH"], values["EVAL_ITERS"] * values["BS"]
    held = max(info.tokens[0] - 1, 0) // seq
    if held >= needed:
        return None
    return (f"the validation set {values['VALID_DATA_PATH']} holds {held} sequences of {seq} "
            f"tokens ({info.tokens[0]:,} tokens), but each evaluation reads the first {needed} "
            f"(EVAL_ITERS {values['EVAL_ITERS']} x BS {values['BS']}). Use the full validation "
            "set, or (open division) fewer MLPERF_EVAL_SAMPLES or a shorter SEQ_LENGTH.")


# Megatron flags (after the KEY=VALUE words) that would change a closed rule behind the
# launcher's back; the guard mlperf_closed_rules refuses them in the closed division.
RULE_FLAGS = ("--hidden-dropout", "--attention-dropout", "--lr", "--min-lr", "--lr-",
              "--adam-", "--weight-decay", "--clip-grad", "--seq-length", "--eval-",
              "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
              "--num-query-groups", "--rotary-", "--use-rope-scaling", "--rope-scaling-factor",
              "--max-position-embeddings", "--optimizer", "--train-samples", "--full-validation",
              "--decoupled-", "--start-weight-decay", "--end-weight-decay",
              "--weight-decay-incr-style")


def rule_flags(user_args: list[str]) -> list[str]:
    return [w for w in user_args if w.startswith("--")
            and any(w == f or (f.endswith("-") and w.startswith(f)) for f in RULE_FLAGS)]
