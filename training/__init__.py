"""Megatron-core pretraining launcher.

training.launch   above the torchrun seam: toggles, recipes, guards, capabilities, run folder.
everything else   below it: the run under torchrun (pretrain_gpt, specs, metrics) and the
                  tools that read run folders (bench, profiling, optimize, convergence).
"""
