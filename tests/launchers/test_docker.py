"""launchers/docker_run.sh: the docker command per vendor, mounts, env pass-through, refusals."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from training.deploy import docker as D
from training.launch.settings import LaunchError

from .conftest import REPO, RECORDER, subprocess_env, write_tool

NVIDIA = D.HostFacts(nvidia=True, amd=False, infiniband=False, cwd=REPO, git_sha="abc123")
AMD = D.HostFacts(nvidia=False, amd=True, infiniband=True, cwd=REPO, git_sha="abc123")
NO_GPU = D.HostFacts(nvidia=False, amd=False, infiniband=False, cwd=REPO)
SCRIPT = str(REPO / "examples/llama/train_llama3.sh")


def dataset(folder: Path, name: str = "train") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for ext in (".bin", ".idx"):
        (folder / f"{name}{ext}").write_bytes(b"")
    return str(folder / name)


def env_pairs(argv):
    return dict(argv[i + 1].split("=", 1) for i, w in enumerate(argv)
                if w == "-e" and "=" in argv[i + 1])


def mounts(argv):
    return [argv[i + 1] for i, w in enumerate(argv) if w == "-v"]


def test_nvidia_command_has_gpus_ipc_shm_network_the_repo_and_the_toggles():
    plan = D.docker_plan({"TP": "2", "NNODES": "2", "DRY_RUN": "1", "UNRELATED": "x"},
                         ["examples/llama/train_llama3.sh", "MODEL_SIZE=tiny", "--manual-gc"],
                         NVIDIA)
    argv = plan.argv
    assert argv[:2] == ["docker", "run"]
    line = " ".join(argv)
    assert "--gpus all" in line and "--ipc host" in line and "--shm-size 64g" in line
    assert "--network host" in line and "--ulimit memlock=-1" in line
    assert "/dev/kfd" not in line and "/dev/infiniband" not in line
    assert mounts(argv) == [f"{REPO}:{REPO}"] and argv[argv.index("-w") + 1] == str(REPO)
    env = env_pairs(argv)
    assert env["TP"] == "2" and env["NNODES"] == "2" and env["PYTHON"] == "python3"
    assert env["GIT_SHA"] == "abc123"
    assert "DRY_RUN" not in env and "UNRELATED" not in env
    image = argv.index("training:cuda")
    assert argv[image + 1:] == ["bash", SCRIPT, "MODEL_SIZE=tiny", "--manual-gc"]
    assert plan.dry_run


def test_amd_command_has_the_rocm_devices_and_infiniband():
    argv = D.docker_plan({"DRY_RUN": "1"}, [], AMD).argv
    line = " ".join(argv)
    assert ("--device /dev/kfd --device /dev/dri --group-add video "
            "--security-opt seccomp=unconfined") in line
    assert "--device /dev/infiniband" in line and "--gpus" not in line
    assert "training:rocm" in argv and argv[-1] == SCRIPT  # the default script


@pytest.mark.parametrize("platform,vendor_flag,image", [
    ("mi355x", "/dev/kfd", "training:rocm"), ("mi300x", "/dev/kfd", "training:rocm"),
    ("b300", "--gpus", "training:cuda"), ("h200", "--gpus", "training:cuda")])
def test_platform_picks_the_vendor_on_any_host_and_stays_outside(platform, vendor_flag, image):
    plan = D.docker_plan({"DRY_RUN": "1", "PLATFORM": platform}, [], NO_GPU)
    assert vendor_flag in plan.argv and image in plan.argv
    assert "PLATFORM" not in env_pairs(plan.argv)
    assert any("not passed into the container" in n for n in plan.notes)


def test_a_real_run_with_platform_is_refused_but_an_inner_dry_run_keeps_it():
    with pytest.raises(LaunchError, match="describes another machine"):
        D.docker_plan({"PLATFORM": "mi355x"}, [], AMD)
    plan = D.docker_plan({"PLATFORM": "mi355x"}, [SCRIPT, "DRY_RUN=1"], AMD)
    assert env_pairs(plan.argv)["PLATFORM"] == "mi355x" and not plan.dry_run


def test_vendor_detection_refuses_when_it_cannot_tell():
    with pytest.raises(LaunchError, match="no GPU found on this host"):
        D.docker_plan({}, [], NO_GPU)
    both = D.HostFacts(nvidia=True, amd=True, infiniband=False, cwd=REPO)
    with pytest.raises(LaunchError, match="both NVIDIA and AMD"):
        D.docker_plan({}, [], both)


def test_a_missing_data_path_is_refused(tmp_path):
    with pytest.raises(LaunchError) as err:
        D.docker_plan({"DRY_RUN": "1", "DATA_PATH": str(tmp_path / "nowhere/train")}, [], NVIDIA)
    text = str(err.value)
    assert "DATA_PATH prefix" in text and "nowhere/train.bin" in text
    assert "not found on this host" in text
    # the KEY=VALUE word wins over the environment, as in the launcher
    with pytest.raises(LaunchError, match="nowhere2"):
        D.docker_plan({"DRY_RUN": "1", "DATA_PATH": dataset(tmp_path / "ok")},
                      [SCRIPT, f"DATA_PATH={tmp_path / 'nowhere2/train'}"], NVIDIA)


def test_data_tokenizer_and_checkpoint_folders_are_mounted_once(tmp_path):
    a, b = dataset(tmp_path / "data/a"), dataset(tmp_path / "data/b", "valid")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    plan = D.docker_plan({"DRY_RUN": "1", "DATA_PATH": f"0.7 {a} 0.3 {b}",
                          "TOKENIZER_MODEL": str(tok / "tokenizer.json"),
                          "SAVE": str(tmp_path / "ckpt"), "EXPERIMENT_DIR": str(tmp_path / "exp")},
                         [SCRIPT, f"VALID_DATA_PATH={b}"], NVIDIA)
    assert mounts(plan.argv) == [f"{p}:{p}" for p in (
        REPO, tmp_path / "data/a", tmp_path / "data/b", tok, tmp_path / "ckpt", tmp_path / "exp")]
    assert env_pairs(plan.argv)["DATA_PATH"] == f"0.7 {a} 0.3 {b}"  # unchanged, same paths inside
    assert not (tmp_path / "ckpt").exists(), "a DRY_RUN creates nothing"


def test_missing_load_or_tokenizer_is_refused(tmp_path):
    for name in ("LOAD", "TOKENIZER_MODEL"):
        with pytest.raises(LaunchError, match=f"{name}=.*does not exist on this host"):
            D.docker_plan({"DRY_RUN": "1", name: str(tmp_path / "missing")}, [], NVIDIA)


def test_nccl_variables_and_docker_env_names_pass_through():
    plan = D.docker_plan({"DRY_RUN": "1", "NCCL_SOCKET_IFNAME": "ib0", "HSA_ENABLE_SDMA": "0",
                          "CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "secret",
                          "DOCKER_ENV": "HF_TOKEN,WANDB_API_KEY"}, [], NVIDIA)
    env = env_pairs(plan.argv)
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["HSA_ENABLE_SDMA"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "secret" not in plan.line
    i = plan.argv.index("HF_TOKEN")
    assert plan.argv[i - 1] == "-e" and "WANDB_API_KEY" in plan.argv


def test_docker_image_and_shm_size_can_be_chosen():
    plan = D.docker_plan({"DRY_RUN": "1", "DOCKER_IMAGE": "reg/t:1", "DOCKER_SHM_SIZE": "128g"},
                         [], NVIDIA)
    assert "reg/t:1" in plan.argv and "training:cuda" not in plan.argv
    assert plan.argv[plan.argv.index("--shm-size") + 1] == "128g"


def test_scripts_outside_the_repository_are_refused(tmp_path):
    outside = tmp_path / "train_x.sh"
    outside.write_text("echo hi\n")
    with pytest.raises(LaunchError, match="not an example entry point"):
        D.docker_plan({"DRY_RUN": "1"}, [str(outside)], NVIDIA)


def test_a_real_run_creates_save_and_experiment_dir_as_the_user(tmp_path):
    env = {"SAVE": str(tmp_path / "ckpt"), "EXPERIMENT_DIR": str(tmp_path / "exp")}
    plan = D.docker_plan(env, [], NVIDIA)
    D.create_writable_dirs(plan, env, [], NVIDIA)
    assert (tmp_path / "ckpt").is_dir() and (tmp_path / "exp").is_dir()


# -- the bash wrapper, end to end -------------------------------------------------------------

def run_wrapper(tmp_path, *args, fake_bin=None, **env):
    return subprocess.run(["bash", str(REPO / "launchers/docker_run.sh"), *args],
                          env=subprocess_env(tmp_path, fake_bin, **env), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("platform,flag", [("b300", "--gpus"), ("mi355x", "/dev/kfd")])
def test_wrapper_dry_run_prints_one_shell_quoted_docker_line(tmp_path, platform, flag):
    proc = run_wrapper(tmp_path, "examples/llama/train_llama3.sh", "EXP_NAME=a b; echo x",
                       DRY_RUN=1, PLATFORM=platform, TP=2)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    argv = shlex.split(lines[0])
    assert argv[:2] == ["docker", "run"] and flag in argv
    assert argv[-1] == "EXP_NAME=a b; echo x" and "TP=2" in argv


def test_wrapper_refuses_a_missing_data_path_with_exit_2(tmp_path):
    proc = run_wrapper(tmp_path, DRY_RUN=1, PLATFORM="b300", DATA_PATH=str(tmp_path / "no/train"))
    assert proc.returncode == 2
    assert "DATA_PATH prefix" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_wrapper_runs_exactly_the_printed_command(tmp_path, fake_bin):
    write_tool(fake_bin, "nvidia-smi", "#!/usr/bin/env bash\necho 'NVIDIA H200'\n")
    write_tool(fake_bin, "docker", RECORDER.format(name="docker", out=tmp_path / "docker.args"))
    printed = run_wrapper(tmp_path, "examples/llama/train_llama3.sh", "TP=2", fake_bin=fake_bin,
                          DRY_RUN=1, GIT_SHA="fixed")
    ran = run_wrapper(tmp_path, "examples/llama/train_llama3.sh", "TP=2", fake_bin=fake_bin,
                      GIT_SHA="fixed")
    assert printed.returncode == 0 and ran.returncode == 0, printed.stderr + ran.stderr
    assert ["docker", *(tmp_path / "docker.args").read_text().splitlines()] == \
        shlex.split(printed.stdout)


def test_runs_with_the_standard_library_only(tmp_path):
    """The host that drives docker may have no project environment: no third-party import."""
    import sys

    env = subprocess_env(tmp_path, DRY_RUN=1, PLATFORM="mi355x", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-S", "-m", "training.deploy.docker"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("docker run ")


def test_secrets_never_ride_on_the_docker_command_line():
    """A secret in the environment or as a word after the script is passed by name; the
    word's value is exported for docker to read, and kept out of DOCKER_LINE (issue 20)."""
    plan = D.docker_plan({"DRY_RUN": "1", "NCCL_IB_SECRET": "s3cret", "HF_TOKEN": "hf_env"},
                         ["examples/llama/train_llama3.sh", "TP=1", "WANDB_API_KEY=wk_word",
                          "--log-params-norm"], NVIDIA)
    for value in ("s3cret", "hf_env", "wk_word"):
        assert value not in plan.line
    for name in ("NCCL_IB_SECRET", "HF_TOKEN", "WANDB_API_KEY"):
        i = plan.argv.index(name)
        assert plan.argv[i - 1] == "-e"
    assert plan.exports == {"WANDB_API_KEY": "wk_word"}
    assert "TP=1" in plan.argv and "--log-params-norm" in plan.argv


def test_the_rocm_forks_variables_reach_the_container():
    """A fork variable in the environment (an alias, or one the launcher reads itself) is passed
    inside like a toggle: the launcher there honours or refuses it, never misses it."""
    plan = D.docker_plan({"DRY_RUN": "1", "SEQ_PARALLEL": "1", "NO_TORCH_COMPILE": "1",
                          "MEGATRON_FSDP": "1"}, [], NVIDIA)
    env = env_pairs(plan.argv)
    assert env["SEQ_PARALLEL"] == "1" and env["NO_TORCH_COMPILE"] == "1"
    assert env["MEGATRON_FSDP"] == "1"
