"""The shape one benchmark measures at: the launcher toggles that set it, and its run description."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from training.launch.presets import FAMILIES, PRESETS
from training.launch.toggles import REGISTRY
from training.run_description import RunDescription


@dataclass(frozen=True)
class BenchShape:
    """The benchmark's request: a launch shape (its toggles) and how long to measure it. The
    CLI's defaults are these fields' defaults; the layout arithmetic is the run description's."""
    family: str = "llama3"
    model_size: str = "8B"          # MODEL_SIZE value of the family
    num_layers: int = 8
    seq_length: int = 8192
    mbs: int = 1
    global_batch: int = 8
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    warmup: int = 2                 # iterations left out of the steady state
    steps: int = 5                  # steady-state iterations measured per run
    repeats: int = 3
    backend: str | None = None      # TRANSFORMER_IMPL of every run (None: the launcher's)
    toggles: tuple[tuple[str, str], ...] = ()  # more launcher toggles of every run (EP=8)

    @property
    def preset(self) -> str:
        return FAMILIES[self.family][0][self.model_size]

    def values(self) -> dict[str, int | str]:
        """Launcher toggles for this shape (a point's own changes go on top)."""
        values = {"MODEL_SIZE": self.model_size, "NUM_LAYERS": self.num_layers,
                  "SEQ_LENGTH": self.seq_length, "MBS": self.mbs, "BS": self.global_batch,
                  "TOTAL_ITERS": self.warmup + self.steps, "METRICS_WARMUP_ITERS": self.warmup,
                  "EVAL_ITERS": 0, "GPUS_PER_NODE": self.gpus, "TP": self.tp, "PP": self.pp}
        if self.backend:
            values["TRANSFORMER_IMPL"] = self.backend
        values.update(self.toggles)
        return values

    def env(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.values().items()}

    def describe(self) -> RunDescription:
        """The run description of the default launch at this shape (registry defaults and
        these toggles; no guard has looked at it)."""
        defaults = {toggle.name: toggle.default for toggle in REGISTRY}
        return RunDescription(self.family, PRESETS[self.preset], {**defaults, **self.values()})

    @property
    def dp(self) -> int:
        return self.describe().layout.dp

    @property
    def microbatches(self) -> int:
        return self.describe().layout.microbatches

    @property
    def tokens_per_step(self) -> int:
        return self.describe().tokens_per_step

    def tag(self) -> str:
        """The shape part of a benchmark name, e.g. llama3-8B-8L_seq8192."""
        layers = "" if self.num_layers == PRESETS[self.preset].num_layers \
            else f"-{self.num_layers}L"
        return f"{self.preset}{layers}_seq{self.seq_length}"

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(model=self.preset, dp=self.dp, tokens_per_step=self.tokens_per_step)
        return out


def hardware_tag(gpu_name: str | None, gpus: int) -> str:
    """h200 for one H200, h200x2 for two; 'gpu' when the name is unknown."""
    from training.platforms import platform_for_device_name

    platform = platform_for_device_name(gpu_name) if gpu_name else None
    base = platform.name if platform else "gpu"
    return base if gpus == 1 else f"{base}x{gpus}"
