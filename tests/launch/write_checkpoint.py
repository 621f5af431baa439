"""A checkpoint folder written the way megatron.training writes it, on the CPU (one gloo rank).

    python tests/launch/write_checkpoint.py SAVE ITERATION [TOGGLE=VALUE ...]

Resolves a DRY_RUN launch of the tiny preset with the toggles given, parses its words with
megatron-core's own parser (validated), builds the LR schedule with megatron's own
get_optimizer_param_scheduler and steps it over ITERATION iterations, then saves with
megatron's dist_checkpointing.save (torch_dist: the common state with `args`, `iteration` and
`opt_param_scheduler` as megatron.training.checkpointing.generate_state_dict lays them out, one
small sharded tensor standing for the model) into SAVE/iter_XXXXXXX and writes Megatron's marker
(get_checkpoint_tracker_filename). What it cannot do on a CPU is build the model and optimizer;
nothing the launcher reads before torchrun comes from them. torch.cuda.synchronize (before
the save's write) is a no-op here, and the save's failure flag a CPU tensor.
"""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    save, iteration = Path(sys.argv[1]), int(sys.argv[2])
    toggles = dict(word.split("=", 1) for word in sys.argv[3:])
    from tests.launch.helpers import launch, megatron_args

    env = {"EXPERIMENT_DIR": str(save.parent / "experiment"), "PATH": os.environ["PATH"]}
    toggles.setdefault("MODEL_SIZE", "tiny")
    result = launch(env, TRANSFORMER_IMPL="native", GPUS_PER_NODE=1, **toggles)
    args = megatron_args(result)

    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.training import checkpointing, global_vars
    from megatron.training.training import get_optimizer_param_scheduler

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.synchronize = lambda *a, **k: None   # before the save's write: CUDA's only
    torch.cuda.current_device = lambda: "cpu"       # the save's failure flag, broadcast
    global_vars.set_args(args)
    weight = torch.nn.Parameter(torch.zeros(4))
    scheduler = get_optimizer_param_scheduler(torch.optim.SGD([weight], lr=args.lr))
    for _ in range(iteration):
        scheduler.step(increment=args.global_batch_size)
    args.consumed_train_samples = iteration * args.global_batch_size
    args.iteration = iteration
    state = {"args": args, "checkpoint_version": 3.0, "iteration": iteration,
             "opt_param_scheduler": scheduler.state_dict(),
             "num_floating_point_operations_so_far": 0,
             "model": {"weight": ShardedTensor.from_rank_offsets("weight", weight.data)}}
    name = checkpointing.get_checkpoint_name(str(save), iteration, return_base_dir=True)
    checkpointing.ensure_directory_exists(name, check_parent=False)
    dist_checkpointing.save(state, name)
    with open(checkpointing.get_checkpoint_tracker_filename(str(save)), "w") as f:
        f.write(str(iteration))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
