"""Multi-node launches: one torchrun per node, every node told the same rendezvous.

By hand, each node runs the example script with NNODES, NODE_RANK, MASTER_ADDR (node 0's
reachable address), MASTER_PORT and one shared RUN_ID. Under Slurm, launchers/slurm/ derives
them from the allocation with this module:

    python -m training.deploy.cluster slurm-env                  this node's `export` lines
    python -m training.deploy.cluster slurm-plan SCRIPT [WORDS]   what every node would run
    python -m training.deploy.cluster srun-command SCRIPT [WORDS] the srun line (bash words)
    python -m training.deploy.cluster sbatch SCRIPT [WORDS]       train.sbatch: runs srun (or,
                                                                  DRY_RUN=1, prints the plan
                                                                  and node 0's launch table)
    python -m training.deploy.cluster node SCRIPT [WORDS]         node.sh: this node's values,
                                                                  then the script (in docker
                                                                  when DOCKER_IMAGE is set)

The bash launchers exec these: nothing a user typed is evaluated by a shell. A secret word
after the script (HF_TOKEN=..., a value with user:password@) is moved into srun's environment,
which Slurm hands every node, and never rides on the srun line; printed lines are masked.

Values (what the table on stderr shows, with where each came from):
    NNODES       SLURM_JOB_NUM_NODES (a different NNODES in your environment is refused)
    NODE_RANK    SLURM_NODEID (a NODE_RANK in your environment is refused: it would be the
                 same on every node)
    MASTER_ADDR  the first host of `scontrol show hostnames $SLURM_JOB_NODELIST`, unless you
                 set it (a loopback address is refused when NNODES > 1)
    MASTER_PORT  29500 + SLURM_JOB_ID % 1000 (two jobs sharing a node do not collide), unless set
    RUN_ID       slurm-<job id> (+ .r<n> after a requeue): every node logs into one run folder
    GPUS_PER_NODE SLURM_GPUS_ON_NODE when Slurm reports it, unless set

Only the standard library is used: this runs on nodes (and hosts driving docker) that may
have no project environment.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from training import REPO_ROOT
from training.cli import ArgumentParser
from training.deploy.scripts import example_script
from training.launch.guards import is_loopback
from training.launch.runfolder import node_log_name
from training.credentials import mask_text, secret_pair
from training.launch.settings import BadInput, LaunchError
from training.launch.toggles import host_problem

PORT_BASE, PORT_SPAN = 29500, 1000


class ClusterError(LaunchError):
    """The allocation or the user's environment cannot make a consistent multi-node launch."""


def scontrol_hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm nodelist (e.g. gpu[001-004]) with scontrol."""
    if shutil.which("scontrol") is None:
        raise ClusterError("scontrol is not on PATH: run inside a Slurm job (sbatch/salloc), "
                           "or set MASTER_ADDR to node 0's address yourself.")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True)
    except subprocess.CalledProcessError as err:
        raise ClusterError(f"`scontrol show hostnames {nodelist}` failed: "
                           f"{err.stderr.strip() or err.returncode}") from None
    except (OSError, subprocess.SubprocessError) as err:
        raise ClusterError(f"`scontrol show hostnames {nodelist}` failed: {err}") from None
    hosts = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if not hosts:
        raise ClusterError(f"`scontrol show hostnames {nodelist}` printed no host.")
    return hosts


@dataclass
class SlurmJob:
    job_id: int
    nnodes: int
    hosts: list[str]
    restart: int = 0

    @property
    def default_port(self) -> int:
        return PORT_BASE + self.job_id % PORT_SPAN

    @property
    def default_run_id(self) -> str:
        return f"slurm-{self.job_id}" + (f".r{self.restart}" if self.restart else "")


@dataclass
class NodeEnv:
    """The variables one node exports, each with (source, reason) for the table."""
    values: dict[str, str] = field(default_factory=dict)
    why: dict[str, tuple[str, str]] = field(default_factory=dict)

    def set(self, name: str, value: object, source: str, reason: str) -> None:
        self.values[name] = str(value)
        self.why[name] = (source, reason)

    def exports(self) -> str:
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.values.items())

    def table(self) -> str:
        width = max((len(k) for k in self.values), default=0)
        return mask_text("".join(f"  {k:<{width}} = {v:<20} {self.why[k][0]:<6} {self.why[k][1]}\n"
                                 for k, v in self.values.items()))


def _int(environ: dict[str, str], *names: str) -> int | None:
    for name in names:
        raw = environ.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ClusterError(f"{name}={raw!r} is not an integer: is this a Slurm job?") \
                    from None
    return None


def slurm_job(environ: dict[str, str],
              hostnames: Callable[[str], list[str]] = scontrol_hostnames) -> SlurmJob:
    job_id = _int(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    nnodes = _int(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if job_id is None or not nodelist or nnodes is None:
        raise ClusterError("not inside a Slurm job (SLURM_JOB_ID, SLURM_JOB_NODELIST or "
                           "SLURM_JOB_NUM_NODES is unset): submit with `sbatch "
                           "launchers/slurm/train.sbatch ...`, or launch each node by hand "
                           "with NNODES, NODE_RANK, MASTER_ADDR and RUN_ID (docs/launch.md).")
    hosts = hostnames(nodelist)
    if len(hosts) != nnodes:
        raise ClusterError(f"the allocation reports {nnodes} nodes but {nodelist!r} expands to "
                           f"{len(hosts)} hosts ({', '.join(hosts)}).")
    return SlurmJob(job_id, nnodes, hosts, _int(environ, "SLURM_RESTART_COUNT") or 0)


def slurm_env(environ: dict[str, str], node_rank: int | None = None,
              hostnames: Callable[[str], list[str]] = scontrol_hostnames) -> NodeEnv:
    """This node's launch variables. node_rank None: SLURM_NODEID (inside an srun task)."""
    job = slurm_job(environ, hostnames)
    if node_rank is None:
        node_rank = _int(environ, "SLURM_NODEID")
        if node_rank is None:
            raise ClusterError("SLURM_NODEID is unset: run this inside an srun task "
                               "(train.sbatch starts one per node).")
        step_nodes = _int(environ, "SLURM_STEP_NUM_NODES")
        if step_nodes is not None and step_nodes != job.nnodes:
            raise ClusterError(f"this job step runs on {step_nodes} of the allocation's "
                               f"{job.nnodes} nodes: start one task on every node "
                               f"(srun --nodes={job.nnodes} --ntasks-per-node=1).")
        step_tasks = _int(environ, "SLURM_STEP_NUM_TASKS")
        if step_tasks is not None and step_nodes is not None and step_tasks != step_nodes:
            raise ClusterError(f"this job step has {step_tasks} tasks on {step_nodes} nodes: "
                               "one torchrun per node needs srun --ntasks-per-node=1 "
                               "(torchrun starts the per-GPU processes itself).")
    if not 0 <= node_rank < job.nnodes:
        raise ClusterError(f"node rank {node_rank} is outside 0..{job.nnodes - 1}.")

    port = environ.get("MASTER_PORT", "").strip()
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise BadInput(f"MASTER_PORT={port!r} is not a port number (1-65535).")
    env = NodeEnv()
    user_nnodes = environ.get("NNODES", "").strip()
    if user_nnodes and user_nnodes != str(job.nnodes):
        raise ClusterError(f"NNODES={user_nnodes} is set in your environment but the allocation "
                           f"has {job.nnodes} nodes: unset NNODES (under Slurm it comes from "
                           f"the allocation) or submit with --nodes={user_nnodes}.")
    env.set("NNODES", job.nnodes, "slurm", "SLURM_JOB_NUM_NODES")
    if environ.get("NODE_RANK", "").strip():
        raise ClusterError(f"NODE_RANK={environ['NODE_RANK']} is set in your environment, so "
                           "every node would claim it: unset NODE_RANK (under Slurm each node's "
                           "rank is its SLURM_NODEID).")
    env.set("NODE_RANK", node_rank, "slurm", f"SLURM_NODEID on {job.hosts[node_rank]}")

    user_addr = environ.get("MASTER_ADDR", "").strip()
    if user_addr and host_problem(user_addr):
        raise BadInput(f"MASTER_ADDR={user_addr!r}: {host_problem(user_addr)}.")
    if user_addr:
        if job.nnodes > 1 and is_loopback(user_addr):
            raise ClusterError(f"MASTER_ADDR={user_addr} is set in your environment, but the "
                               "other nodes cannot reach node 0 through a loopback address: "
                               f"unset MASTER_ADDR (the allocation's first host, "
                               f"{job.hosts[0]}, is used) or set node 0's reachable address.")
        env.set("MASTER_ADDR", user_addr, "env", "set in your environment (kept)")
    else:
        env.set("MASTER_ADDR", job.hosts[0], "slurm",
                "first host of scontrol show hostnames $SLURM_JOB_NODELIST")
    for name, default, reason in (
            ("MASTER_PORT", job.default_port, f"{PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}"),
            ("RUN_ID", job.default_run_id, "the job id: one run folder for all nodes")):
        if environ.get(name, "").strip():
            env.set(name, environ[name].strip(), "env", "set in your environment (kept)")
        else:
            env.set(name, default, "slurm", reason)
    gpus = environ.get("GPUS_PER_NODE", "").strip()
    slurm_gpus = _int(environ, "SLURM_GPUS_ON_NODE")
    if gpus:
        env.set("GPUS_PER_NODE", gpus, "env", "set in your environment (kept)")
    elif slurm_gpus:
        env.set("GPUS_PER_NODE", slurm_gpus, "slurm", "SLURM_GPUS_ON_NODE")
    return env


def resolve_script(script: str, repo: Path = REPO_ROOT) -> Path:
    """The example script a node runs, as an absolute path inside the repository's examples."""
    return example_script(script, repo)


def srun_command(environ: dict[str, str], script: str, words: list[str],
                 repo: Path = REPO_ROOT) -> list[str]:
    """The srun line train.sbatch runs: node.sh once on every node of the allocation."""
    nnodes = _int(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if nnodes is None:
        raise ClusterError("SLURM_JOB_NUM_NODES is unset: submit with sbatch "
                           "(launchers/slurm/README.md).")
    path = resolve_script(script, repo)
    image, docker = environ.get("CONTAINER_IMAGE", ""), environ.get("DOCKER_IMAGE", "")
    if image and docker:
        raise BadInput("CONTAINER_IMAGE (pyxis/enroot) and DOCKER_IMAGE (docker) are both set: "
                       "choose one container runtime.")
    argv = ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", "--label"]
    try:
        argv += shlex.split(environ.get("SRUN_ARGS", ""))
    except ValueError as err:
        raise BadInput(f"SRUN_ARGS cannot be split into words: {err}.") from None
    if image:
        mounts = ",".join(m for m in (f"{repo}:{repo}", environ.get("CONTAINER_MOUNTS", "")) if m)
        argv += [f"--container-image={image}", f"--container-mounts={mounts}",
                 f"--container-workdir={repo}", "--export=ALL,PYTHON=python3"]
    return argv + ["bash", str(repo / "launchers" / "slurm" / "node.sh"), str(path),
                   *public_words(words)[0]]


def public_words(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the words that may ride on a command line, the secret KEY=VALUE words before the first
    --flag: passed by environment instead)."""
    public, secrets = [], {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            public += words[i:]
            break
        key, eq, value = word.partition("=")
        if eq and key.isidentifier() and secret_pair(key, value):
            secrets[key] = value
        else:
            public.append(word)
    return public, secrets


def slurm_plan(environ: dict[str, str], script: str, words: list[str],
               hostnames: Callable[[str], list[str]] = scontrol_hostnames,
               repo: Path = REPO_ROOT) -> str:
    """What every node would run, one line each (DRY_RUN of train.sbatch)."""
    path = resolve_script(script, repo)
    job = slurm_job(environ, hostnames)
    runner = (["bash", str(repo / "launchers" / "docker_run.sh"), str(path)]
              if environ.get("DOCKER_IMAGE") else ["bash", str(path)])
    lines = []
    for rank, host in enumerate(job.hosts):
        env = slurm_env(environ, rank, hostnames=lambda _nodelist: job.hosts)
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.values.items())
        log = node_log_name(job.nnodes, rank)
        lines.append(f"node {rank} ({host}, log {log}): {assigns} {shlex.join(runner + words)}")
    return mask_text("\n".join(lines)) + "\n"


def _runner(environ: dict[str, str], script: Path, repo: Path) -> list[str]:
    if environ.get("DOCKER_IMAGE"):
        return ["bash", str(repo / "launchers" / "docker_run.sh"), str(script)]
    return ["bash", str(script)]


def run_node(environ: dict[str, str], script: str, words: list[str],
             node_rank: int | None = None, repo: Path = REPO_ROOT) -> None:
    """node.sh (and a DRY_RUN's node 0): this node's values on stderr, then the script with
    them in its environment; replaces this process."""
    path = resolve_script(script, repo)
    env = slurm_env(environ, node_rank)
    sys.stderr.write(f"node {env.values['NODE_RANK']} of {env.values['NNODES']}:\n" + env.table())
    sys.stderr.flush()
    sys.stdout.flush()
    argv = _runner(environ, path, repo) + words
    os.execvpe(argv[0], argv, {**environ, **env.values})


def run_sbatch(environ: dict[str, str], script: str, words: list[str],
               repo: Path = REPO_ROOT) -> None:
    """train.sbatch: srun over every node (secret words in its environment), or with DRY_RUN=1
    the srun line, every node's plan and node 0's own launch (which prints, runs nothing)."""
    argv = srun_command(environ, script, words, repo)
    public, secrets = public_words(words)
    if environ.get("DRY_RUN", "0").strip() == "1":
        print(mask_text(shlex.join(argv)))
        sys.stdout.write(slurm_plan(environ, script, public, repo=repo))
        run_node({**environ, **secrets}, script, public, node_rank=0, repo=repo)
        return
    sys.stdout.flush()
    sys.exit(run_and_requeue(argv, {**environ, **secrets}))


def run_and_requeue(argv: list[str], environ: dict[str, str]) -> int:
    """srun, then the batch job's answer to its status: a preempted run (the supervisor's
    exit 75: it saved at Slurm's warning signal) is requeued with `scontrol requeue`, so it
    resumes from that checkpoint when it runs again (RUN_ID slurm-<job>.r<n>, LOAD=SAVE).
    A warning signal sent to this batch process alone (`--signal=B:USR2@...`) goes on to srun,
    which hands it to every task."""
    from training.resilience.exits import PREEMPTED

    proc = subprocess.Popen(argv, env=environ)
    signal.signal(signal.SIGUSR2, lambda signum, frame: proc.send_signal(signum))
    status = proc.wait()
    job = environ.get("SLURM_JOB_ID", "").strip()
    if status == PREEMPTED and job:
        requeue = ["scontrol", "requeue", job]
        print(f"train.sbatch: the run was preempted and saved (exit {PREEMPTED}): "
              f"{shlex.join(requeue)}", file=sys.stderr, flush=True)
        try:
            done = subprocess.run(requeue, env=environ, timeout=60).returncode
        except (OSError, subprocess.SubprocessError) as err:
            done = f"{err}"
        if done != 0:
            print(f"train.sbatch: `{shlex.join(requeue)}` failed ({done}): submit the job "
                  "again to resume from the checkpoint.", file=sys.stderr, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = ArgumentParser(prog="python -m training.deploy.cluster",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("slurm-env", "slurm-plan", "srun-command", "sbatch",
                                           "node"))
    parser.add_argument("--node-rank", type=int, default=None,
                        help="slurm-env for this node rank instead of SLURM_NODEID (DRY_RUN "
                             "on the batch host)")
    parser.add_argument("script", nargs="?", help="examples/*/train_*.sh (plan, srun-command)")
    parser.add_argument("words", nargs=argparse.REMAINDER, help="KEY=VALUE words, --flags")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    try:
        if args.action == "slurm-env":
            env = slurm_env(environ, args.node_rank)
            sys.stderr.write(f"node {env.values['NODE_RANK']} of {env.values['NNODES']}:\n"
                             + env.table())
            sys.stdout.write(env.exports())
            return 0
        if not args.script:
            raise BadInput(f"{args.action} needs the example script, e.g. "
                           "examples/llama/train_llama3.sh.")
        if args.action == "slurm-plan":
            sys.stdout.write(slurm_plan(environ, args.script, public_words(args.words)[0]))
        elif args.action == "srun-command":
            sys.stdout.write(mask_text(shlex.join(srun_command(environ, args.script,
                                                               args.words))) + "\n")
        elif args.action == "sbatch":
            run_sbatch(environ, args.script, args.words)
        else:
            run_node(environ, args.script, args.words)
    except LaunchError as err:
        print(f"error: {mask_text(str(err))}", file=sys.stderr)
        return err.exit_code
    except OSError as err:   # exec: srun or bash missing
        print(f"error: cannot start {err.filename or 'the command'}: {err.strerror or err}.",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
