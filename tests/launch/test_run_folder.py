"""The run folder: single folder names, never written over, writable before torchrun;
SAVE and LOAD checked; LOG_DIR (the fork's name for the run folder) and words that would
replace the launch script's own variables (issue 20)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from training.launch import resolve as resolve_mod
from training.launch.__main__ import shell_assignments
from training.launch.runfolder import mark_ours
from training.launch.guards import SCRIPT_VARIABLES, Refusals
from training.launch.manifest import write_launch_manifest
from training.launch.settings import Settings, Setting
from training.launch.toggles import REGISTRY

from .helpers import launch
from .test_dry_run import REPO, run


def _refusal(base_env, guard, words=(), **env) -> str:
    with pytest.raises(Refusals) as err:
        launch(base_env, words=list(words), **env)
    text = str(err.value)
    assert f"[{guard}]" in text, text
    return text


def test_the_default_run_name_carries_every_field_at_a_second_value(base_env):
    """Each field away from its default (the dry-run test names the default launch), so a
    field dropped or swapped in the name shows: 4 of the preset's 32 layers, 8 GPUs, TP, PP
    and CP 2, MBS 2, BS 64, sequence 4096."""
    result = launch(base_env, PLATFORM="h200", NUM_LAYERS=4, GPUS_PER_NODE=8, TP=2, PP=2,
                    CP=2, MBS=2, BS=64, SEQ_LENGTH=4096)
    assert result.ctx.run_name == "llama3-8B-4L_n1x8_tp2pp2cp2_mbs2gbs64_seq4096"
    assert result.ctx.log_dir.parts[-3:-1] == (result.ctx.run_name, "bf16")


@pytest.mark.parametrize("word", ["RUN_ID=../../x", "RUN_ID=a/b", "RUN_ID=..", "RUN_ID=",
                                  "EXP_NAME=../up"])
def test_run_id_and_exp_name_are_single_folder_names(base_env, tmp_path, word):
    assert "single folder name" in _refusal(base_env, "run_folder", [word])
    proc = run(tmp_path, word)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def _a_run_in(folder: Path, what: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    mark_ours(folder)   # the launcher's marker: what a launch leaves beside its manifest
    if what == "manifest":
        (folder / "manifest.json").write_text(json.dumps({"dry_run": False,
                                                          "created": "2026-12-01T10:00:00"}))
    else:
        (folder / what).write_text("a run was here\n")


@pytest.mark.parametrize("what", ["train.log", "metrics.jsonl", "manifest"])
def test_a_folder_holding_a_run_is_refused_and_left_alone(base_env, tmp_path, what):
    first = launch(base_env, RUN_ID="r")
    _a_run_in(first.log_dir, what)
    before = {p.name: p.read_bytes() for p in first.log_dir.iterdir()}
    text = _refusal(base_env, "run_folder", RUN_ID="r")
    assert "already holds a run" in text and str(first.log_dir) in text
    # the bash entrypoint with DRY_RUN: exit 2, and no manifest written over the run
    proc = run(tmp_path, "RUN_ID=r", EXPERIMENT_DIR=base_env["EXPERIMENT_DIR"])
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert {p.name: p.read_bytes() for p in first.log_dir.iterdir()} == before


def test_a_dry_run_manifest_is_not_a_run(base_env):
    first = launch(base_env, RUN_ID="r")
    write_launch_manifest(first)
    again = launch(base_env, RUN_ID="r")
    assert again.log_dir == first.log_dir


def test_a_timestamp_that_names_a_run_gets_a_suffix(base_env):
    settings = Settings({t.name: Setting(t.name, t.default, "default") for t in REGISTRY})
    settings.values["EXPERIMENT_DIR"] = Setting("EXPERIMENT_DIR", base_env["EXPERIMENT_DIR"],
                                                "env")
    taken = Path(base_env["EXPERIMENT_DIR"]) / "name" / "bf16" / "20261201-100000"
    _a_run_in(taken, "train.log")
    _a_run_in(taken.with_name("20261201-100000-2"), "metrics.jsonl")
    log_dir, problem = resolve_mod._derive_run_folder(settings, "name", "bf16",
                                                      stamp="20261201-100000")
    assert problem is None and log_dir.name == "20261201-100000-3"
    assert settings["RUN_ID"] == "20261201-100000-3"
    assert "20261201-100000 holds a run" in settings.setting("RUN_ID").reason


def test_other_nodes_share_node_zeros_folder(base_env):
    env = dict(NNODES=2, MASTER_ADDR="node0", RUN_ID="job", GPUS_PER_NODE=1)
    node0 = launch(base_env, NODE_RANK=0, **env)
    _a_run_in(node0.log_dir, "manifest")
    _a_run_in(node0.log_dir, "train.node0.log")
    node1 = launch(base_env, NODE_RANK=1, **env)     # node 0 started first: fine
    assert node1.log_dir == node0.log_dir
    _a_run_in(node0.log_dir, "train.node1.log")
    assert "train.node1.log" in _refusal(base_env, "run_folder", NODE_RANK=1, **env)
    assert "train.node0.log" in _refusal(base_env, "run_folder", NODE_RANK=0, **env)


def test_experiment_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    proc = run(tmp_path, EXPERIMENT_DIR=str(tmp_path / "afile"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "is a file, not a folder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_experiment_dir_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = run(tmp_path, EXPERIMENT_DIR=str(ro))
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 2 and "not writable" in proc.stderr, proc.stderr


def test_save_must_be_writable_and_load_a_folder(base_env, tmp_path):
    (tmp_path / "afile").write_text("")
    assert "is a file" in _refusal(base_env, "save_checkpoint", SAVE=tmp_path / "afile")
    assert "is a file" in _refusal(base_env, "save_checkpoint", SAVE=tmp_path / "afile" / "ckpt")
    launch(base_env, SAVE=tmp_path / "new" / "ckpt")          # created by Megatron: fine
    assert not (tmp_path / "new").exists()                     # and nothing made before it
    assert "is a file" in _refusal(base_env, "load_checkpoint", LOAD=tmp_path / "afile")


def test_log_dir_names_the_run_folder_and_the_log_file_follows(tmp_path):
    target = tmp_path / "logs" / "mine"
    proc = run(tmp_path, f"LOG_DIR={target}")
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("LOG_DIR=", "LOG_FILE=")))
    assert lines["LOG_DIR"] == str(target) and lines["LOG_FILE"] == str(target / "train.log")
    assert json.loads((target / "manifest.json").read_text())["log_dir"] == str(target)
    # an empty LOG_DIR= word means unset: the default folder, and the log file inside it
    proc = run(tmp_path, "LOG_DIR=")
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("LOG_DIR=", "LOG_FILE=")))
    assert proc.returncode == 0 and Path(lines["LOG_FILE"]).parent == Path(lines["LOG_DIR"])
    assert str(tmp_path / "experiment") in lines["LOG_DIR"]


def test_log_dir_with_exp_name_or_run_id_is_refused(base_env, tmp_path):
    assert "LOG_DIR" in _refusal(base_env, "run_folder", LOG_DIR=tmp_path / "x", RUN_ID="r")
    result = launch(base_env, LOG_DIR=tmp_path / "x")
    assert result.log_dir == tmp_path / "x"
    assert any("EXPERIMENT_DIR" in n.message for n in result.settings.notices)


@pytest.mark.parametrize("word", ["LOG_FILE=/tmp/x.log", "PATH=/nowhere", "GPT_ARGS=--x"])
def test_words_that_would_replace_the_scripts_variables_are_refused(base_env, word):
    assert word.split("=")[0] in _refusal(base_env, "script_variables", [word])


def test_script_variables_cover_what_the_script_defines(base_env):
    """Every name the shell assignments and examples/lib/launch.sh assign is in the list."""
    text = shell_assignments(launch(base_env))
    assigned = {m.group(1) for m in re.finditer(r"^([A-Z_]+)=", text, re.M)}
    script = (REPO / "examples" / "lib" / "launch.sh").read_text()
    assigned |= {m.group(1) for m in re.finditer(r"^\s*(?:export\s+)?([A-Z_]+)=", script, re.M)}
    own = {t.name for t in REGISTRY}      # toggles (LOG_DIR, DRY_RUN, TEE_OUTPUT): a word sets them
    assert assigned - own <= set(SCRIPT_VARIABLES), assigned - own - set(SCRIPT_VARIABLES)


def test_extra_megatron_args_with_an_open_quote_is_one_line(tmp_path):
    proc = run(tmp_path, EXTRA_MEGATRON_ARGS="--ckpt-step '10")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "EXTRA_MEGATRON_ARGS" in proc.stderr


@pytest.mark.parametrize("name", [".launcher-run", "launch.txt", "manifest.json",
                                  "metrics.jsonl", "train.log"])
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_run_folder_file_that_is_a_link_or_fifo_is_refused_not_written(tmp_path, name, kind):
    """A file the launch writes, put there as a link to a file outside the folder or as a FIFO:
    refused in one line before anything is written (it was written through, or hung the
    launch for 30 s)."""
    folder = tmp_path / "logs" / "mine"
    folder.mkdir(parents=True)
    if name != ".launcher-run":
        mark_ours(folder)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    if kind == "link":
        os.symlink(outside, folder / name)
    else:
        os.mkfifo(folder / name)
    proc = run(tmp_path, f"LOG_DIR={folder}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert name in proc.stderr and "[run_folder]" in proc.stderr   # (a log: "holds a run")
    assert outside.read_text() == "precious\n"
    assert name == "manifest.json" or not (folder / "manifest.json").exists()
