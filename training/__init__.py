"""Megatron-core pretraining launcher (docs/architecture.md: what lives where).

training.launch   above the torchrun seam: toggles, recipes, guards, capabilities, run folder;
                  recipe layers plug in from above (training.mlperf.layer).
training.deploy   Slurm, docker and image tools that run the example scripts on hosts.
training.run_description   the resolved run, typed: shared by both sides of the seam.
everything else   below the seam: the run under torchrun (pretrain_gpt, specs, metrics) and the
                  tools that read run folders (bench, profiling, optimize, convergence, mlperf).
"""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]   # the checkout: examples/, docs/, tests/
