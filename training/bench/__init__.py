"""Benchmark harness: measured levers and peers, recorded as JSON under docs/benchmarks/.

  record.py     what every benchmark JSON carries (command, git sha, GPU, driver, versions)
  ours.py       one point of ours: the real launcher in a subprocess, read back from its run folder
  hf_peer.py    the Hugging Face LlamaForCausalLM peer (SDPA, bf16, fused AdamW, optional Liger)
  stats.py      steady-state statistics and ratios
  table.py      markdown tables generated from the JSONs
  __main__.py   `python -m training.bench peers|table ...`
"""
