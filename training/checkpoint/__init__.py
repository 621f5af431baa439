"""Hugging Face decoder checkpoints in and out of Megatron's distributed checkpoint format:
Llama (any width, tied or untied), Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE and Mixtral.

    python -m training.checkpoint import HF_DIR OUT   # HF safetensors + config -> OUT (Megatron)
    python -m training.checkpoint export CKPT HF_OUT  # a Megatron checkpoint -> HF safetensors

The import writes what megatron.training's `--load`/`--pretrained-checkpoint` read with
`--ckpt-format torch_dist` (the default), loadable at any TP/PP/DP; the launcher starts a run
from it with PRETRAINED_CHECKPOINT (weights only, fresh optimizer, iteration 0). The export
writes safetensors shards and a config.json that transformers loads. Both stream one tensor at
a time into a temporary sibling folder that is renamed at the end (docs/checkpoints.md).

  layout      each family's conversion table (the tensors of each side, one map for both
              directions); the config is read by training/launch/model_config.py
  gpt_oss     gpt-oss's table (layout's row blocks, state dicts in memory, both directions)
  hf          a Hugging Face folder: config, safetensors headers and reads, the export's files
  megatron    the Megatron side: the streaming dist-checkpoint writer, the per-layer reader
  record      the import record (hf_import.json) the launcher's guard reads (no torch)
  staging     temporary sibling folder, disk-space check, clean-up on error or signal
  convert     import_checkpoint() and export_checkpoint()
"""
