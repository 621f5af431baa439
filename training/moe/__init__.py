"""The mixture-of-experts family: Qwen3-MoE and Mixtral on Megatron-core's MoE layer.

It plugs into the launcher from above (the core imports nothing from here):

  presets.py        model presets (Qwen3-30B-A3B, Mixtral-8x7B, tiny MoE shapes for tests),
                    registered with the launcher's tables at import
  layer.py          the recipe layer: the EP/ETP/MOE_* toggles and megatron-core's MoE guards
  launch.py         the entry point examples/moe/train_*.sh resolve through (the layer on)
  docs.py           README's MoE tables;  __main__.py  `python -m training.moe flops`
  hf_qwen3_moe.py   Hugging Face Qwen3-MoE weights -> our GPTModel (parity tests, import)
  gpt_oss.py        the gpt-oss family (20b, 120b, MLPerf's 20b, tiny): its flags and guards
                    (docs/gpt_oss.md; its weights: training/checkpoint/gpt_oss.py)

The layer itself is Megatron's (router, token dispatcher, experts); the native backend's
grouped experts live with the other native kernels (training/native/grouped_experts.py).
"""
