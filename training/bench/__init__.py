"""Benchmark harness: every lever and peer measured, recorded as JSON under docs/benchmarks/.

  shape.py       the shape/layout a benchmark runs at and the launcher toggles that set it
  catalog.py     every lever (a change against the launcher default) and the `all` parts
  suites.py      configs of a toggles/peers suite, prechecked before any GPU work
  sweep.py       the loop: rotated repeats, budget, a JSON rewritten after every point
  plan.py        wall-time estimates, calibrated from recorded runs (`--plan`)
  ours.py        one point of ours: the real launcher, read back from its run folder
  runners.py     the real runner (ours, HF, torchtitan subprocesses) and peer availability
  hf_peer.py     the Hugging Face LlamaForCausalLM peer (SDPA, bf16, fused AdamW, +Liger)
  titan_peer.py  the torchtitan peer (its Trainer and llama3 or Qwen3 MoE model at our shape)
  stats.py       steady-state statistics and the verdict rule (faster/slower/within noise)
  analysis.py    points -> one result row per lever or peer (recomputed, never stored-only)
  table.py       markdown tables of a JSON
  levers.py      docs/levers.json, docs/levers.md, docs/benchmarks.md
  readme.py      the README's perf-table block
  record.py      the JSON header (command, git sha, GPU, driver, versions) and atomic writes
  __main__.py    `python -m training.bench toggles|peers|all|levers|readme|table`
"""
