"""The issue-39 check at the published widths: random-weight Hugging Face folders built from the
real config.json of published models (tests/checkpoint/published.py), layers cut, widths real.

    python dev/check_published_models.py                       # all eleven, 2 layers, bf16
    python dev/check_published_models.py SmolLM2 TinyLlama     # those whose Hub id holds a word
    python dev/check_published_models.py --ours --json out.json

For each: import, export, bitwise round trip, transformers' logits on the export equal to the
source's, and a DRY_RUN from the import whose Megatron arguments (parsed and validated by
Megatron's own code) carry the model's shape; with --ours also our GPTModel built from that
launch, loaded from the import, against transformers (bf16: within 3x HF's own bf16 rounding
error, tests/model/parity.py's yardstick). Memory: an 8B width's 2 layers and 128k-row
embedding need ~10 GB in bf16 (--ours: twice). The CPU suite runs the same steps at test widths
(tests/checkpoint/test_published.py). Exit 1 when one fails; the JSON holds every result.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def check(hub_id: str, config: dict, root: Path, ours: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from tests.checkpoint.helpers import assert_bitwise_equal
    from tests.checkpoint.published import (expect_args, launch_config, ours_from_launch,
                                            random_hf_model)
    from tests.launch.helpers import megatron_args
    from tests.model.parity import check_bf16_parity, compare, fp32_logits
    from training.checkpoint.convert import export_checkpoint, import_checkpoint

    steps = {}
    start = time.perf_counter()
    hf_model, hf = random_hf_model(root, config, torch.bfloat16)
    steps["random_folder"] = True
    out = root / "megatron"
    import_checkpoint(str(hf), out, progress=False)
    steps["import"] = True
    export_checkpoint(out, root / "back", progress=False)
    steps["export"] = True
    assert_bitwise_equal(hf, root / "back")
    steps["bitwise"] = True
    tokens = torch.randint(0, config["vocab_size"], (1, 16),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():   # both as transformers loads them (RoPE frequencies alike)
        source, back = (AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
                        for folder in (hf, root / "back"))
        assert torch.equal(source(input_ids=tokens).logits, back(input_ids=tokens).logits)
        steps["hf_logits_equal"] = True
    del source, back
    env = {"EXPERIMENT_DIR": str(root / "experiment")}
    result = launch_config(env, config, PRETRAINED_CHECKPOINT=out, NATIVE_KERNELS="torch",
                           TRANSFORMER_IMPL="native")
    expect_args(megatron_args(result), config)
    steps["dry_run_shape"] = result.settings.setting("MODEL_SIZE").source == "checkpoint"
    if ours:
        from training.checkpoint.megatron import load_weights

        gpt = ours_from_launch(result, config["vocab_size"], torch.bfloat16)
        load_weights(gpt, out)
        from tests.moe.model import cpu_dispatcher_streams

        with cpu_dispatcher_streams():
            compared = compare(hf_model, gpt.eval(), tokens, fp32_logits(hf_model, tokens))
        check_bf16_parity(compared)
        steps["ours_vs_hf"] = {k: round(v, 6) for k, v in compared.items()}
    steps["seconds"] = round(time.perf_counter() - start, 1)
    return steps


def main(argv: list[str] | None = None) -> int:
    from tests.checkpoint.published import PUBLISHED, cut

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="only the models whose Hub id holds one")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ours", action="store_true", help="also our model's logits")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    chosen = [h for h in PUBLISHED if not args.words or any(w in h for w in args.words)]
    results, failed = {}, 0
    for hub_id in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                results[hub_id] = {"ok": True, **check(hub_id, cut(PUBLISHED[hub_id],
                                                                   args.layers),
                                                       Path(tmp), args.ours)}
            except Exception as err:   # a check script: report every model, then fail
                failed += 1
                results[hub_id] = {"ok": False, "error": f"{type(err).__name__}: {err}",
                                   "traceback": traceback.format_exc()[-3000:]}
        print(f"{hub_id}: {'ok' if results[hub_id]['ok'] else results[hub_id]['error']}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"layers": args.layers, "ours": args.ours,
                                         "results": results}, indent=1) + "\n")
    print(f"{len(chosen) - failed} of {len(chosen)} pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
