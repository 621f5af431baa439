"""The compute efficiency the throughput projection scales a platform's peak by: a model fitted
to published figures, with few parameters, each with a physical meaning.

The projection (training/optimize/project.py) writes a step as compute + the pipeline's bubble
+ the communication left exposed. For a reference (docs/scale/references.json: a published or
recorded tokens/s/GPU with its setup) the communication and the bubble follow from the layout
and the links, so the compute time that makes the step equal the reference's is found by
bisection, and with it the reference's *implied efficiency*: model FLOPs of the step over (the
platform's dense peak for the precision x compute time). This module fits

    log(efficiency) = sum of coefficient x feature

by ridge regression (numpy least squares; every coefficient but the intercept is pulled toward
zero, so a feature no reference informs, a platform without a published figure for instance,
takes the shared value instead of a guess). The features (FEATURES) are what moves a GEMM-bound
step's efficiency on real machines:

  platform:<name>   the GPU's sustained rate against its datasheet peak (power and clock: a
                    GB300 runs the same datasheet fp8 rate as a GB200 at a higher power limit)
  fp8, mxfp8, fp4   the recipe's share of the peak it is computed against: fp8 for every
                    low-precision recipe (counted against the fp8 peak), mxfp8 on top of it for
                    MXFP8 (its blocks' scaling against tensor-scaled fp8: kept apart, and
                    measured on pairs, references.PAIRED: the same setup published in both
                    recipes, so layout, links and release cancel), fp4 on top
                    of it for nvfp4/mxfp4 (the datasheets' fp4 rates are not typed here: the
                    fitted fp4 coefficient is the gain the published fp4 runs show over fp8)
  fp4_ultra         fp4 on Blackwell Ultra (B300/GB300), whose fp4 tensor cores are wider
  moe, moe_width    a mixture of experts, and log2 of its expert width over the hidden size
                    (narrow experts: small grouped GEMMs, router and permutation overheads)
  moe_tokens        log2 of the tokens each local expert's grouped GEMM sees per micro-batch
                    (balanced routing: micro-batch x top-k x EP / experts) over 4096
  log_width         log2 of the hidden size per TP rank over 4096 (a GEMM's width at its split)
  log_mbs           log2 of the micro-batch (larger GEMMs, fewer launches: MBS 4-8 earns)
  log_tp, log_cp    log2 of TP and CP (GEMMs at their split shapes; attention split by CP)
  fsdp              FSDP's per-layer gathers contending with compute
  native            our native backend (our measured runs; a published row is resolved on
                    the Transformer Engine its recipe ran) against Transformer Engine

The attention scores and the logits of a low-precision recipe, which stay in bf16, are counted
against the bf16 peak (project.compute_peak), not through a feature. No software date is a
feature: the same setup speeds up release by release (Megatron-Bridge's MoE rows most), but a
trend fitted to it projected the held-out setups worse than none (the leave-one-out table with
and without it), so each release's figure is one more reference and the spread between
releases shows in the bands.

Nothing here is typed from a reference: the coefficients come from the fit, every time, and a
reference left out of the fit (leave-one-out, training/optimize/references.py) is projected by a
model that never saw it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from training.platforms import PLATFORMS

FP8 = ("fp8", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise")
FP4 = ("nvfp4", "mxfp4")
ULTRA = ("b300", "gb300")
FEATURES: tuple[str, ...] = (
    "intercept", *(f"platform:{p}" for p in PLATFORMS), "fp8", "mxfp8", "fp4", "fp4_ultra",
    "moe", "moe_width", "moe_tokens", "log_width", "log_mbs", "log_tp", "log_cp",
    "fsdp", "native")
# the intercept and the recipes' coefficients are not pulled toward zero: every platform that
# publishes a low-precision figure informs them, and a recipe's cost is physics, not a guess
UNPULLED = ("intercept", "fp8", "mxfp8", "fp4", "fp4_ultra")
RIDGE = 0.5         # the pull of every coefficient but the intercept toward zero (the strength
                    # the leave-one-out table liked best of 0.01-2: a mild optimism, said in docs)
HUBER = 0.1         # log-efficiency distance beyond which a reference's weight falls (Huber)
IRLS_STEPS = 20
MAX_EFFICIENCY = 0.95   # an implied efficiency above this says the comm model is too slow


def attention_share(model) -> float:
    """The share of a step's model FLOPs in attention scores and the weighted sum of values."""
    from training.metrics import attention_keys, flops_per_token

    attention = 3 * sum(4 * attention_keys(model, layer) * model.q_width
                        for layer in range(1, model.num_layers + 1))
    return attention / flops_per_token(model)


def expert_tokens(run) -> float:
    """Tokens each local expert's GEMMs see per micro-batch, routing balanced: the EP group's
    top-k copies spread over the experts (the M of the grouped GEMM)."""
    from .memory import expert_parallel

    m, lay = run.model, run.layout
    ep, _ = expert_parallel(run)
    tokens = lay.mbs * m.seq_length / (lay.cp * lay.tp)
    return tokens * m.router_topk * ep / m.num_experts


def features(run) -> dict[str, float]:
    """The features of a resolved run (training.run_description.RunDescription)."""
    m, lay = run.model, run.layout
    precision = run.precision
    moe = 1.0 if m.moe else 0.0
    x = {"intercept": 1.0, f"platform:{run.platform}": 1.0,
         "fp8": 1.0 if precision in FP8 + ("mxfp8",) + FP4 else 0.0,
         "mxfp8": 1.0 if precision == "mxfp8" else 0.0,
         "fp4": 1.0 if precision in FP4 else 0.0,
         "fp4_ultra": 1.0 if precision in FP4 and run.platform in ULTRA else 0.0,
         "moe": moe,
         "moe_width": math.log2(m.moe_ffn_hidden_size / m.hidden_size) if m.moe else 0.0,
         "moe_tokens": math.log2(expert_tokens(run) / 4096) if m.moe else 0.0,
         "log_width": math.log2(m.hidden_size / lay.tp / 4096),
         "log_mbs": math.log2(lay.mbs),
         "log_tp": math.log2(lay.tp), "log_cp": math.log2(lay.cp),
         "fsdp": 1.0 if run.get("FSDP") else 0.0,
         "native": 1.0 if run.backend != "transformer_engine" else 0.0}
    return x


def vector(x: dict[str, float]) -> np.ndarray:
    unknown = set(x) - set(FEATURES)
    if unknown:
        raise KeyError(f"features not in the model: {sorted(unknown)}")
    return np.array([x.get(name, 0.0) for name in FEATURES])


@dataclass(frozen=True)
class Sample:
    """One reference as the fit sees it: its features and log(implied efficiency)."""
    id: str
    x: dict[str, float]
    log_efficiency: float
    group: str = ""       # references of one setup (the same figure in several releases)


@dataclass(frozen=True)
class Fit:
    coefficients: dict[str, float]
    ids: tuple[str, ...]                 # the references it was fitted on
    ridge: float = RIDGE
    residual_rms: float = 0.0
    informed: frozenset = field(default_factory=frozenset)   # features some reference has

    def efficiency(self, x: dict[str, float]) -> float:
        log_e = sum(self.coefficients[k] * v for k, v in x.items())
        return min(math.exp(log_e), MAX_EFFICIENCY)

    def terms(self, x: dict[str, float]) -> list[tuple[str, float, float]]:
        """(feature, value, coefficient) of the features this run has."""
        return [(k, v, self.coefficients[k]) for k, v in x.items() if v]

    def uninformed(self, x: dict[str, float]) -> list[str]:
        """Features this run has that no fitted reference had (their coefficient is 0)."""
        return [k for k, v in x.items() if v and k not in self.informed]


def fit(samples: list[Sample], ridge: float = RIDGE, huber: float = HUBER,
        fixed: dict[str, float] | None = None) -> Fit:
    """Ridge least squares of log(efficiency) on the features (UNPULLED not pulled), made
    robust by Huber weights (iteratively reweighted): a reference further than `huber` (in
    log efficiency) from the fit counts as if it were at that distance, so one odd published
    figure (a recipe regression, an untuned layout) does not drag every projection with it.
    `fixed`: coefficients measured elsewhere (a paired comparison), held at their value."""
    if not samples:
        raise ValueError("no references to fit the efficiency on")
    fixed = dict(fixed or {})
    X = np.array([vector(s.x) for s in samples])
    y = np.array([s.log_efficiency for s in samples])
    held = np.array([fixed.get(name, 0.0) for name in FEATURES])
    y = y - X @ held
    X[:, [j for j, name in enumerate(FEATURES) if name in fixed]] = 0.0
    pull = np.array([0.0 if name in UNPULLED else math.sqrt(ridge) for name in FEATURES])
    weights = np.ones(len(samples))
    for _ in range(IRLS_STEPS):
        root = np.sqrt(weights)[:, None]
        A = np.vstack([X * root, np.diag(pull)])
        b = np.concatenate([y * root[:, 0], np.zeros(len(FEATURES))])
        theta, *_ = np.linalg.lstsq(A, b, rcond=None)
        distance = np.abs(y - X @ theta)
        weights = np.where(distance <= huber, 1.0, huber / np.maximum(distance, 1e-12))
    residual = y - X @ theta
    theta = theta + held
    informed = frozenset(name for j, name in enumerate(FEATURES) if np.any(X[:, j] != 0)) \
        | frozenset(fixed)
    return Fit(dict(zip(FEATURES, map(float, theta))), tuple(s.id for s in samples), ridge,
               float(np.sqrt(np.mean(residual ** 2))), informed)
