"""Continue and extend a run: the launcher reads LOAD's checkpoint before torchrun (a folder
written with megatron-core's own dist_checkpointing.save and LR scheduler,
tests/launch/write_checkpoint.py), takes the last complete checkpoint, and says which LR
schedule the resume follows; a kill at any point of a save never leaves a resume pointing at
a half-written folder."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.checkpoint_scan import TRACKER, incomplete_reason, last_complete, scan
from training.launch.resume import saved_run, schedule_changes

from .helpers import launch, megatron_args
from .test_guards import notices, refused

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ten_of_ten(tmp_path_factory) -> Path:
    """A TOTAL_ITERS=10 BS=8 run of the tiny preset, saved at iteration 10."""
    folder = tmp_path_factory.mktemp("ckpt") / "ten"
    subprocess.run([sys.executable, str(REPO / "tests/launch/write_checkpoint.py"), str(folder),
                    "10", "TOTAL_ITERS=10", "BS=8", "LR=1e-3", "MIN_LR=1e-4"],
                   check=True, capture_output=True, timeout=300)
    return folder


@pytest.fixture
def load(ten_of_ten, tmp_path) -> Path:
    """A copy of it each test may cut into."""
    return Path(shutil.copytree(ten_of_ten, tmp_path / "load"))


def test_saved_run_is_read_with_megatrons_own_reader(ten_of_ten):
    saved = saved_run(ten_of_ten / "iter_0000010")
    assert (saved.iteration, saved.consumed_samples, saved.global_batch_size,
            saved.train_iters) == (10, 80, 8, 10)
    # megatron's scheduler in samples: warm-up 10% of 10 iterations, decay over all 10
    assert saved.schedule["lr_warmup_steps"] == 8 and saved.schedule["lr_decay_steps"] == 80
    assert saved.schedule["max_lr"] == 1e-3 and saved.schedule["num_steps"] == 80


def test_extending_a_run_keeps_the_checkpoints_schedule_and_says_so(base_env, load):
    """TOTAL_ITERS=10 -> 20: Megatron asserted 'class input value 16 and checkpoint value 8
    for warmup iterations'; the launcher takes the checkpoint's schedule (its own flag) and
    the DRY_RUN shows the plan."""
    result = launch(base_env, MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=20, BS=8, LR=1e-3,
                    MIN_LR=1e-4)
    assert result.settings["RESUME_SCHEDULE"] == "checkpoint"
    assert "--use-checkpoint-opt_param-scheduler" in result.buckets["TRAIN_ARGS"]
    plan = " ".join(n.message for n in notices(result, "resume_schedule"))
    assert "at iteration 10" in plan and "80 samples consumed" in plan
    assert "iterations 11-20" in plan and "TOTAL_ITERS 10 -> 20" in plan
    assert "warm-up 1 -> 2 iterations (8 -> 16 samples)" in plan
    assert "decay span 10 -> 20 iterations" in plan
    args = megatron_args(result)          # Megatron's own parser takes the words
    assert args.use_checkpoint_opt_param_scheduler and not args.override_opt_param_scheduler


def test_the_schedule_megatron_builds_loads_the_checkpoints_without_its_assert(base_env, load):
    """What Megatron's OptimizerParamScheduler does with the launcher's words: without the
    flag its load asserts (the reported traceback); with it, the checkpoint's schedule."""
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    saved = saved_run(load / "iter_0000010")

    def scheduler(args):
        return OptimizerParamScheduler(
            torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr), init_lr=0.0,
            max_lr=args.lr, min_lr=args.min_lr,
            lr_warmup_steps=args.lr_warmup_iters * args.global_batch_size,
            lr_decay_steps=args.train_iters * args.global_batch_size,
            lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay,
            end_wd=args.weight_decay, wd_incr_steps=args.train_iters * args.global_batch_size,
            wd_incr_style="constant",
            use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
            override_opt_param_scheduler=args.override_opt_param_scheduler)

    env = dict(base_env, MODEL_SIZE="tiny", LOAD=str(load), TOTAL_ITERS="20", BS="8",
               LR="1e-3", MIN_LR="1e-4")
    ours = megatron_args(launch(env))
    plain = megatron_args(launch(env, RESUME_SCHEDULE="checkpoint"))
    plain.use_checkpoint_opt_param_scheduler = False   # what a launch without it passed
    with pytest.raises(AssertionError, match="warmup iterations do not match"):
        scheduler(plain).load_state_dict(saved.schedule)
    kept = scheduler(ours)
    kept.load_state_dict(saved.schedule)
    assert (kept.lr_warmup_steps, kept.lr_decay_steps) == (8, 80)
    new = scheduler(megatron_args(launch(env, RESUME_SCHEDULE="new")))
    new.load_state_dict(saved.schedule)
    assert (new.lr_warmup_steps, new.lr_decay_steps, new.num_steps) == (16, 160, 80)


def test_a_schedule_setting_you_gave_that_differs_needs_your_choice(base_env, load):
    msg = refused(base_env, "resume_schedule", MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=20,
                  BS=8, LR=2e-3, MIN_LR=1e-4)
    assert "peak LR 0.001 -> 0.002" in msg
    assert "RESUME_SCHEDULE=new" in msg and "RESUME_SCHEDULE=checkpoint" in msg
    result = launch(base_env, MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=20, BS=8, LR=2e-3,
                    MIN_LR=1e-4, RESUME_SCHEDULE="new")
    assert "--override-opt_param-scheduler" in result.buckets["TRAIN_ARGS"]
    plan = " ".join(n.message for n in notices(result, "resume_schedule"))
    assert "Schedule: this launch's" in plan and "LR 0.002" in plan


def test_an_unchanged_schedule_passes_no_flag(base_env, load):
    result = launch(base_env, MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=20, BS=8, LR=1e-3,
                    MIN_LR=1e-4, WARMUP_ITERS=1, LR_DECAY_ITERS=10)
    # the weight-decay span follows TOTAL_ITERS (no effect: constant weight decay), so the
    # checkpoint's is taken; the LR schedule is the same
    assert result.settings["RESUME_SCHEDULE"] == "checkpoint"
    saved = saved_run(load / "iter_0000010")
    changes = schedule_changes(saved, result.settings.as_values())
    assert [c.field for c in changes] == ["wd_incr_steps"] and changes[0].inert


def test_a_batch_size_change_is_explained(base_env, load):
    result = launch(base_env, MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=20, BS=16, LR=1e-3,
                    MIN_LR=1e-4)
    warned = " ".join(n.message for n in notices(result, "resume_schedule")
                      if n.level == "warning")
    assert "BS 8 -> 16" in warned and "80 consumed" in warned


def test_nothing_left_to_train_is_refused(base_env, load):
    msg = refused(base_env, "resume_schedule", MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=10)
    assert "TOTAL_ITERS above 10" in msg


# -- a kill at every point of a save ------------------------------------------------------------

def _save_steps(source: Path) -> list[tuple[str, bytes]]:
    """The files of a torch_dist save in the order megatron-core writes them: the data
    (*.distcp), torch DCP's index (.metadata, at its finish), megatron's metadata.json
    (dist_checkpointing.save's finalize)."""
    files = sorted(source.iterdir(), key=lambda p: (p.name == "metadata.json",
                                                    p.name == ".metadata", p.name))
    assert [p.name for p in files][-2:] == [".metadata", "metadata.json"]
    return [(p.name, p.read_bytes()) for p in files]


def _states(load: Path):
    """Every state a SIGKILL can leave while iteration 20 is saved beside a complete 10: each
    file of the save absent, cut short or whole, in write order; then the marker."""
    steps = _save_steps(load / "iter_0000010")
    yield "before the save", None
    for done in range(len(steps)):
        for cut in (0, 1, len(steps[done][1]) // 2):
            yield f"{steps[done][0]} cut at {cut} bytes", (steps[:done], steps[done], cut)
    yield "every file written, marker not yet", (steps, None, 0)


def test_a_kill_at_every_point_of_a_save_resumes_the_last_complete(base_env, load, tmp_path):
    from training.checkpoint_marker import write_marker

    seen = set()
    for label, state in _states(load):
        folder = Path(shutil.copytree(load, tmp_path / f"k{len(seen)}"))
        if state is not None:
            whole, partial, cut = state
            target = folder / "iter_0000020"
            target.mkdir()
            for name, data in whole:
                (target / name).write_bytes(data)
            if partial is not None:
                (target / partial[0]).write_bytes(partial[1][:cut])
        every_file = state is not None and state[1] is None
        found = scan(folder)
        iteration, skipped = last_complete(folder)
        assert iteration == (20 if every_file else 10), label
        if state is not None and not every_file:
            assert skipped and skipped[0].startswith("iter_0000020:"), label
        result = launch(base_env, MODEL_SIZE="tiny", LOAD=folder, TOTAL_ITERS=30, BS=8,
                        LR=1e-3, MIN_LR=1e-4)
        words = result.buckets["OUTPUT_ARGS"]
        if every_file:   # killed after the last file, before the marker: 20 is complete
            assert found.redirect() and words[words.index("--ckpt-step") + 1] == "20", label
            warned = " ".join(n.message for n in notices(result, "load_checkpoint"))
            assert "iter_0000020/, the last complete checkpoint" in warned
        else:            # the marker names 10, complete: Megatron's own choice
            assert found.redirect() is None and "--ckpt-step" not in words, label
        seen.add(label)
        if every_file:   # then the marker moves (atomically): 20 is the marker's own choice
            write_marker(folder / TRACKER, "20")
            assert scan(folder).redirect() is None
    assert len(seen) >= 10


def test_a_marker_naming_a_half_written_folder_resumes_the_last_complete(base_env, load):
    """A marker Megatron (or a copy) left pointing at a folder cut short: the resume takes the
    last complete checkpoint, through Megatron's --ckpt-step, and says which and why."""
    half = load / "iter_0000020"
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"\0" * 10)
    (load / TRACKER).write_text("20")
    result = launch(base_env, MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=30, BS=8, LR=1e-3,
                    MIN_LR=1e-4)
    words = result.buckets["OUTPUT_ARGS"]
    assert words[words.index("--ckpt-step") + 1] == "10"
    assert result.settings.setting("CKPT_STEP").source == "derived"
    warned = " ".join(n.message for n in notices(result, "load_checkpoint"))
    assert "names iter_0000020/, which is incomplete" in warned
    assert "takes iter_0000010/" in warned
    plan = " ".join(n.message for n in notices(result, "resume_schedule"))
    assert "at iteration 10" in plan
    assert megatron_args(result).ckpt_step == 10


def test_an_empty_marker_is_refused_with_the_fix(base_env, load):
    """megatron-core's own write, killed between truncation and write: Megatron's load would
    exit on it before --ckpt-step counts, so the launcher says what to write."""
    (load / TRACKER).write_text("")
    msg = refused(base_env, "load_checkpoint", MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=30)
    assert "is empty" in msg and f"printf 10 > {load / TRACKER}" in msg


def test_ckpt_step_at_a_half_written_folder_is_refused(base_env, load):
    (load / "iter_0000005").mkdir()
    msg = refused(base_env, "load_checkpoint", MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=30,
                  CKPT_STEP=5)
    assert "iter_0000005/ is empty" in msg and "iter_0000010" in msg


def test_only_half_written_checkpoints_is_no_checkpoint(base_env, tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "iter_0000010").mkdir(parents=True)
    (folder / "iter_0000010" / "__0_0.distcp").write_bytes(b"x")
    msg = refused(base_env, "load_checkpoint", LOAD=folder)
    assert "iter_0000010: no metadata.json" in msg and "RESUME=auto" in msg
    result = launch(base_env, LOAD=folder, RESUME="auto")
    assert "--ckpt-step" not in result.buckets["OUTPUT_ARGS"]


def test_completeness_rules(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    assert "empty" in incomplete_reason(dist)
    (dist / ".metadata").write_bytes(b"x")
    assert "not metadata.json" in incomplete_reason(dist)
    assert incomplete_reason(dist, "torch_dcp") is None
    (dist / "metadata.json").write_text('{"sharded_backend": "torch_')
    assert "cut short" in incomplete_reason(dist)
    (dist / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    assert incomplete_reason(dist) is None
    legacy = tmp_path / "legacy" / "mp_rank_00"
    legacy.mkdir(parents=True)
    import torch

    torch.save({"x": torch.zeros(3)}, legacy / "model_optim_rng.pt")
    assert incomplete_reason(legacy.parent) is None
    data = (legacy / "model_optim_rng.pt").read_bytes()
    (legacy / "model_optim_rng.pt").write_bytes(data[:len(data) // 2])
    assert "cut short" in incomplete_reason(legacy.parent)


def test_async_save_builds_megatrons_flags_and_refuses_other_formats(base_env, tmp_path):
    result = launch(base_env, SAVE=tmp_path / "s", ASYNC_SAVE=1)
    words = result.buckets["OUTPUT_ARGS"]
    assert "--async-save" in words and "--use-persistent-ckpt-worker" in words
    args = megatron_args(result)   # without the persistent worker Megatron drops --async-save
    assert args.async_save and args.async_strategy == "mcore"
    msg = refused(base_env, "async_save", SAVE=tmp_path / "s", ASYNC_SAVE=1,
                  CKPT_FORMAT="torch", PREFLIGHT_MEMORY="off")
    assert "CKPT_FORMAT=torch_dist" in msg


def test_an_unreadable_saved_state_takes_the_checkpoints_schedule(base_env, load):
    """Saved arguments the launcher cannot read (a foreign pickle, a damaged object): the
    checkpoint's schedule, said, rather than Megatron's assert after torchrun."""
    for data in (load / "iter_0000010").glob("*.distcp"):
        data.write_bytes(b"\0" * 64)
    result = launch(base_env, MODEL_SIZE="tiny", LOAD=load, TOTAL_ITERS=20)
    assert result.settings["RESUME_SCHEDULE"] == "checkpoint"
    reason = result.settings.setting("RESUME_SCHEDULE").reason
    assert "not read here" in reason and "cannot be read" in reason
