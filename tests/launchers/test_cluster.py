"""Multi-node and Slurm: per-node values from fake SLURM_* environments, the sbatch path end to end
with a fake scontrol/srun, per-node logs."""
from __future__ import annotations

import shlex
import subprocess

import pytest

from training.deploy import cluster
from training.launch.runfolder import node_log_name
from training.launch.settings import LaunchError

from .conftest import REPO, RECORDER, SLURM_TWO_NODES, subprocess_env, write_tool

HOSTS = {"gpu[001-002]": ["gpu001", "gpu002"], "gpu001": ["gpu001"]}


def hostnames(nodelist):
    return HOSTS[nodelist]


def env_for(**extra):
    env = {k: v for k, v in SLURM_TWO_NODES.items() if k != "SLURM_SUBMIT_DIR"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


# -- python: this node's values ------------------------------------------------------------------

def test_node_values_come_from_the_allocation():
    env = cluster.slurm_env(env_for(SLURM_NODEID=1), hostnames=hostnames)
    assert env.values == {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "gpu001",
                          "MASTER_PORT": str(29500 + 4242 % 1000), "RUN_ID": "slurm-4242"}
    assert env.why["MASTER_ADDR"][0] == "slurm"
    assert "export NODE_RANK=1\n" in env.exports()


def test_every_node_agrees_on_the_rendezvous_and_run_folder():
    nodes = [cluster.slurm_env(env_for(SLURM_NODEID=r), hostnames=hostnames) for r in (0, 1)]
    for name in ("NNODES", "MASTER_ADDR", "MASTER_PORT", "RUN_ID"):
        assert nodes[0].values[name] == nodes[1].values[name], name
    assert [n.values["NODE_RANK"] for n in nodes] == ["0", "1"]


def test_a_requeued_job_gets_its_own_run_id_and_gpus_come_from_slurm():
    env = cluster.slurm_env(env_for(SLURM_RESTART_COUNT=2, SLURM_GPUS_ON_NODE=8),
                            hostnames=hostnames)
    assert env.values["RUN_ID"] == "slurm-4242.r2"
    assert env.values["GPUS_PER_NODE"] == "8"


def test_user_values_for_addr_port_run_id_and_gpus_are_kept():
    env = cluster.slurm_env(env_for(MASTER_ADDR="10.1.2.3", MASTER_PORT=31000, RUN_ID="mine",
                                    GPUS_PER_NODE=4, SLURM_GPUS_ON_NODE=8), hostnames=hostnames)
    assert (env.values["MASTER_ADDR"], env.values["MASTER_PORT"], env.values["RUN_ID"],
            env.values["GPUS_PER_NODE"]) == ("10.1.2.3", "31000", "mine", "4")
    assert {env.why[k][0] for k in ("MASTER_ADDR", "MASTER_PORT", "RUN_ID")} == {"env"}


@pytest.mark.parametrize("extra,needle", [
    ({"NODE_RANK": "0"}, "NODE_RANK=0 is set in your environment"),
    ({"NNODES": "4"}, "NNODES=4 is set in your environment but the allocation has 2 nodes"),
    ({"MASTER_ADDR": "127.0.0.1"}, "loopback"),
    ({"MASTER_ADDR": "localhost"}, "loopback"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not a port number"),
    ({"SLURM_STEP_NUM_NODES": "1"}, "this job step runs on 1 of the allocation's 2 nodes"),
    ({"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16"}, "--ntasks-per-node=1"),
    ({"SLURM_JOB_NODELIST": "gpu001"}, "expands to 1 hosts"),
    ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not an integer"),
])
def test_inconsistent_launches_are_refused_with_what_to_do(extra, needle):
    with pytest.raises(LaunchError) as err:
        cluster.slurm_env(env_for(**extra), hostnames=hostnames)
    assert needle in str(err.value)


def test_one_node_may_use_loopback_and_outside_slurm_is_refused():
    one = env_for(SLURM_JOB_NODELIST="gpu001", SLURM_JOB_NUM_NODES=1, MASTER_ADDR="127.0.0.1")
    assert cluster.slurm_env(one, hostnames=hostnames).values["MASTER_ADDR"] == "127.0.0.1"
    with pytest.raises(LaunchError, match="not inside a Slurm job"):
        cluster.slurm_env({}, hostnames=hostnames)


def test_scontrol_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LaunchError, match="scontrol is not on PATH"):
        cluster.scontrol_hostnames("gpu[001-002]")


def test_node_log_names():
    assert node_log_name(1, 0) == "train.log"
    assert [node_log_name(2, r) for r in (0, 1)] == ["train.node0.log", "train.node1.log"]


# -- python: the srun line -------------------------------------------------------------------------

def test_srun_runs_node_sh_once_per_node_with_the_script_and_words():
    argv = cluster.srun_command(env_for(SRUN_ARGS="--gpus-per-task=8"),
                                "examples/llama/train_llama3.sh", ["TP=2", "--manual-gc"])
    assert argv[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=1", "--label"]
    assert "--gpus-per-task=8" in argv
    i = argv.index("bash")
    assert argv[i + 1:] == [str(REPO / "launchers/slurm/node.sh"),
                            str(REPO / "examples/llama/train_llama3.sh"), "TP=2", "--manual-gc"]
    assert not any(a.startswith("--container") for a in argv)


def test_srun_with_a_pyxis_image_mounts_the_repo_and_uses_the_images_python():
    argv = cluster.srun_command(env_for(CONTAINER_IMAGE="reg/training:cuda",
                                        CONTAINER_MOUNTS="/data:/data"),
                                "examples/llama/train_llama3.sh", [])
    assert "--container-image=reg/training:cuda" in argv
    assert f"--container-mounts={REPO}:{REPO},/data:/data" in argv
    assert "--export=ALL,PYTHON=python3" in argv


@pytest.mark.parametrize("extra,script,needle", [
    ({"CONTAINER_IMAGE": "a", "DOCKER_IMAGE": "b"}, "examples/llama/train_llama3.sh",
     "choose one container runtime"),
    ({}, "examples/llama/nope.sh", "no script 'examples/llama/nope.sh'"),
])
def test_srun_refusals(extra, script, needle):
    with pytest.raises(LaunchError) as err:
        cluster.srun_command(env_for(**extra), script, [])
    assert needle in str(err.value)


# -- bash: the sbatch script, node.sh, per-node logs -------------------------------------------------

def spool_copy(tmp_path):
    """sbatch runs a copy of the script from its spool folder: do the same."""
    spool = tmp_path / "spool" / "job4242"
    spool.mkdir(parents=True)
    copy = spool / "slurm_script"
    copy.write_text((REPO / "launchers/slurm/train.sbatch").read_text())
    return copy


def test_sbatch_dry_run_prints_every_nodes_launch_and_node_0s_table_without_srun(
        tmp_path, fake_bin):
    write_tool(fake_bin, "srun", RECORDER.format(name="srun", out=tmp_path / "srun.args"))
    env = subprocess_env(tmp_path, fake_bin, DRY_RUN=1, **SLURM_TWO_NODES)
    proc = subprocess.run(["bash", str(spool_copy(tmp_path)), "examples/llama/train_llama3.sh",
                           "MODEL_SIZE=tiny"], env=env, cwd=tmp_path / "spool",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "srun.args").exists(), "DRY_RUN must not start srun"
    lines = proc.stdout.splitlines()
    plan = [line for line in lines if line.startswith("node ")]
    assert len(plan) == 2
    for rank, line in enumerate(plan):
        assert f"NODE_RANK={rank} " in line and "MASTER_ADDR=gpu001" in line
        assert "RUN_ID=slurm-4242" in line and f"train.node{rank}.log" in line
    assert lines[0].startswith("srun --nodes=2 ")
    torchrun = shlex.split(next(x for x in lines if x.startswith("torchrun ")))
    pairs = dict(zip(torchrun[1:11:2], torchrun[2:11:2]))
    assert pairs["--nnodes"] == "2" and pairs["--node-rank"] == "0"
    assert pairs["--master-addr"] == "gpu001" and pairs["--master-port"] == "29742"
    log_file = next(x for x in lines if x.startswith("LOG_FILE="))
    assert log_file.endswith("/slurm-4242/train.node0.log")


def test_sbatch_starts_one_srun_over_all_nodes(tmp_path, fake_bin):
    write_tool(fake_bin, "srun", RECORDER.format(name="srun", out=tmp_path / "srun.args"))
    env = subprocess_env(tmp_path, fake_bin, **SLURM_TWO_NODES)
    proc = subprocess.run(["bash", str(spool_copy(tmp_path)), "examples/llama/train_llama3.sh",
                           "TP=2"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[:2] == ["--nodes=2", "--ntasks=2"]
    assert args[-4:] == ["bash", str(REPO / "launchers/slurm/node.sh"),
                         str(REPO / "examples/llama/train_llama3.sh"), "TP=2"]


def test_sbatch_without_a_repository_says_how_to_point_at_it(tmp_path, fake_bin):
    env = subprocess_env(tmp_path, fake_bin, **dict(SLURM_TWO_NODES, SLURM_SUBMIT_DIR=str(tmp_path)))
    proc = subprocess.run(["bash", str(spool_copy(tmp_path)), "examples/llama/train_llama3.sh"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "set REPO=/path/to/repo" in proc.stderr and "Traceback" not in proc.stderr


def test_node_sh_runs_the_script_as_its_node(tmp_path, fake_bin):
    env = subprocess_env(tmp_path, fake_bin, DRY_RUN=1, SLURM_STEP_NUM_NODES=2,
                         SLURM_STEP_NUM_TASKS=2, **dict(SLURM_TWO_NODES, SLURM_NODEID="1"))
    proc = subprocess.run(["bash", str(REPO / "launchers/slurm/node.sh"),
                           str(REPO / "examples/llama/train_llama3.sh"), "MODEL_SIZE=tiny"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("DISTRIBUTED_ARGS:"))
    assert "--nnodes 2 --node-rank 1 --master-addr gpu001 --master-port 29742" in line
    assert "NODE_RANK   = 1" in proc.stderr  # the derivation table, with sources
    log_file = next(x for x in proc.stdout.splitlines() if x.startswith("LOG_FILE="))
    assert log_file.endswith("/slurm-4242/train.node1.log")


def test_node_sh_refuses_a_node_rank_from_the_environment(tmp_path, fake_bin):
    env = subprocess_env(tmp_path, fake_bin, DRY_RUN=1, NODE_RANK=0, **SLURM_TWO_NODES)
    proc = subprocess.run(["bash", str(REPO / "launchers/slurm/node.sh"),
                           str(REPO / "examples/llama/train_llama3.sh")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unset NODE_RANK" in proc.stderr and "Traceback" not in proc.stderr
    assert "torchrun" not in proc.stdout


@pytest.mark.parametrize("nnodes,rank,expected", [(1, 0, "train.log"), (2, 1, "train.node1.log")])
def test_example_script_names_the_log_per_node(tmp_path, nnodes, rank, expected):
    env = subprocess_env(tmp_path, DRY_RUN=1, NNODES=nnodes, NODE_RANK=rank,
                         MASTER_ADDR="10.0.0.1", RUN_ID="shared")
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log_dir = next(x for x in proc.stdout.splitlines() if x.startswith("LOG_DIR="))[8:]
    log_file = next(x for x in proc.stdout.splitlines() if x.startswith("LOG_FILE="))[9:]
    assert log_file == f"{log_dir}/{expected}"
    assert log_dir.endswith("/shared")


def test_multinode_without_run_id_warns(tmp_path):
    env = subprocess_env(tmp_path, DRY_RUN=1, NNODES=2, NODE_RANK=1, MASTER_ADDR="10.0.0.1")
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert "multinode_run_id" in proc.stderr
    env["RUN_ID"] = "shared"
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "multinode_run_id" not in proc.stderr


def test_loopback_master_addr_with_two_nodes_is_refused_by_the_entrypoint(tmp_path):
    env = subprocess_env(tmp_path, DRY_RUN=1, NNODES=2, NODE_RANK=0, MASTER_ADDR="127.0.0.1",
                         RUN_ID="r")
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "multinode_master_addr" in proc.stderr and "Traceback" not in proc.stderr


def test_slurm_env_runs_with_the_standard_library_only(tmp_path, fake_bin):
    """Nodes (and hosts driving docker) may have no project environment."""
    import sys

    env = subprocess_env(tmp_path, fake_bin, PYTHONPATH=str(REPO), **SLURM_TWO_NODES)
    proc = subprocess.run([sys.executable, "-S", "-m", "training.deploy.cluster", "slurm-env"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "export MASTER_ADDR=gpu001\n" in proc.stdout


def test_two_slurm_nodes_on_one_host_resolve_through_sbatch_and_node_sh(tmp_path):
    """The path of the two-"node" GPU test (tests/launchers/test_multinode_gpu.py) with
    DRY_RUN on each node: train.sbatch -> srun -> node.sh per node -> the example script; every
    node prints its own torchrun line, one rendezvous, one run folder."""
    from .conftest import one_host_slurm

    env, logs = one_host_slurm(tmp_path, "10.0.0.7", node_env="DRY_RUN=1", GPUS_PER_NODE=1)
    proc = subprocess.run(["bash", str(spool_copy(tmp_path)), "examples/llama/train_llama3.sh",
                           "MODEL_SIZE=tiny"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        out = (logs / f"node{rank}.out").read_text()
        words = shlex.split(next(x for x in out.splitlines() if x.startswith("torchrun ")))
        pairs = dict(zip(words[1:11:2], words[2:11:2]))
        assert pairs == {"--nnodes": "2", "--node-rank": str(rank), "--master-addr": "10.0.0.7",
                         "--master-port": "29742", "--nproc-per-node": "1"}, pairs
        log_file = next(x for x in out.splitlines() if x.startswith("LOG_FILE="))
        assert log_file.endswith(f"/slurm-4242/train.node{rank}.log")
