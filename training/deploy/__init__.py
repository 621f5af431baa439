"""Deployment: running the example scripts on hosts, beside the resolver (training/launch/).

  cluster     Slurm: each node's NNODES/NODE_RANK/MASTER_ADDR/RUN_ID, the srun line
              (launchers/slurm/)
  docker      the `docker run` command for an example script (launchers/docker_run.sh)
  image       installing this package into a GPU base image (docker/Dockerfile.*)
  gpu_check   `make train`'s first step: one line when no GPU is visible

Standard library only (hosts that drive docker or Slurm may have no project environment); of
the resolver it uses public names only (a test checks), and the resolver uses none of it.
"""
