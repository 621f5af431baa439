"""MLPerf Training llama31_8b with this launcher (docs/mlperf.md).

  rules        examples/mlperf/llama31_8b/config.yaml: the closed rules, the cadence arithmetic,
               the checks behind the guard mlperf_closed_rules
  layer        the recipe layer (training/launch/layers.py): the MLPERF_* knobs, the recipe's
               values, the guard mlperf_closed_rules; docs: its README blocks
  launch       `python -m training.mlperf.launch`: the launcher with the layer (the run script
               examples/mlperf/llama31_8b/run_llama31_8b.sh calls it)
  events       mllog (<run>/mlperf.log, rank 0) and the stop at the target eval loss, driven by
               training/loop_hooks.py's loop listeners
  valid_data   the validation split read in file order: every evaluation, the same first sequences
  compliance   mlperf-logging's compliance checker on a log, with a per-check summary
  summary      time to train, samples to converge, eval-loss curve PNG
"""
