"""Per-iteration router statistics of an MoE model, for metrics.jsonl.

  moe_load_imbalance       the worst MoE layer's max over mean tokens per expert this iteration
                           (1.0: every expert got the same number of tokens; the bound is
                           experts / top-k, every token on the same k experts)
  moe_load_imbalance_mean  the same ratio averaged over the MoE layers
  moe_<aux loss name>      Megatron's own load-balancing losses (load_balancing_loss, ...) as
                           its MoE metrics tracker reduces and reports them: the mean over MoE
                           layers, before the coefficient (kept by the patch table's
                           moe_router_losses entry, capturing_aggregate below)

Tokens per expert are counted by a forward hook on each router (the routing map of every
micro-batch's training forward; evaluation and no-grad forwards are left out) into one buffer
per layer that lives for the whole run, added to in place and zeroed after each summary: a
full-iteration CUDA graph (CUDA_GRAPH) captures the hook's add at its capture and replays it,
where a Python hook does not run again. They are summed over the
ranks that see different tokens of the same layer (tensor-, context- and data-parallel, which
includes expert parallelism), and gathered over pipeline stages. Every rank calls summary():
its collectives run on all of them.
"""
from __future__ import annotations

import torch


class RouterStats:
    def __init__(self):
        self.counts: dict[int, torch.Tensor] = {}    # MoE layer number -> tokens per expert
        self.num_layers = 0
        self.aux_losses: dict[str, float] = {}

    # -- collection ---------------------------------------------------------------------------

    def attach(self, model_chunks) -> int:
        """Hook every router of the model (a module or a list of chunks); returns how many."""
        from megatron.core.transformer.moe.router import Router

        chunks = model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]
        hooked = 0
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, Router):
                    self.num_layers = max(self.num_layers, module.config.num_layers)
                    module.register_forward_hook(self._record)
                    hooked += 1
        return hooked

    def _record(self, router, inputs, output) -> None:
        if not (router.training and torch.is_grad_enabled()):
            return
        tokens = output[1].sum(dim=0)       # the routing map, [tokens, experts]
        counts = self.counts.get(router.layer_number)
        if counts is None:                  # the first training forward (eager)
            counts = self.counts[router.layer_number] = torch.zeros(
                tokens.shape, dtype=torch.float64, device=tokens.device)
        counts.add_(tokens)

    def keep_megatron_losses(self, scalars: dict) -> dict:
        """The scalars Megatron's MoE tracker aggregated at this iteration's report (its aux
        losses, reduced over the ranks as Megatron logs them)."""
        self.aux_losses = {name: float(value) for name, value in scalars.items()}
        return scalars

    # -- the iteration's figures ---------------------------------------------------------------

    def summary(self, sum_groups=(), pp_group=None) -> dict:
        """This iteration's figures (then reset). sum_groups: the process groups whose ranks
        see different tokens of the same layers; pp_group: the pipeline stages."""
        aux, self.aux_losses = self.aux_losses, {}
        record = {f"moe_{name}": value for name, value in aux.items()}
        if not self.num_layers:
            return record
        experts = next(iter(self.counts.values())).numel() if self.counts else 0
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and pp_group is not None:   # every stage needs the experts count
            size = torch.tensor([float(experts)], device=_device())
            torch.distributed.all_reduce(size, op=torch.distributed.ReduceOp.MAX, group=pp_group)
            experts = int(size.item())
        if not experts:
            return record
        # [layers, experts]: this rank's layers filled, the others zero
        table = torch.zeros(self.num_layers, experts, dtype=torch.float64, device=_device())
        for layer, tokens in self.counts.items():
            table[layer - 1] = tokens.to(table.device)
            tokens.zero_()                  # in place: a captured graph adds into it
        if distributed:
            for group in sum_groups:
                torch.distributed.all_reduce(table, group=group)
            if pp_group is not None:
                torch.distributed.all_reduce(table, group=pp_group)
        routed = table.sum(dim=1) > 0
        if not routed.any():
            return record
        ratios = table[routed].max(dim=1).values / table[routed].mean(dim=1)
        record["moe_load_imbalance"] = ratios.max().item()
        record["moe_load_imbalance_mean"] = ratios.mean().item()
        return record


def _device() -> str:
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


def megatron_groups():
    """(sum_groups, pp_group) of Megatron's parallel state: the tensor-parallel group and the
    data-parallel group with context parallelism (expert parallelism lies inside it)."""
    from megatron.core import parallel_state

    return ((parallel_state.get_tensor_model_parallel_group(),
             parallel_state.get_data_parallel_group(with_context_parallel=True)),
            parallel_state.get_pipeline_model_parallel_group())


def capturing_aggregate(original, run):
    """MoEMetricsTracker._aggregate, its result also kept for the run's metrics.jsonl line."""

    def _aggregate(tracker, *a, **kw):
        scalars = original(tracker, *a, **kw)
        stats = getattr(run.loop, "router", None)
        return stats.keep_megatron_losses(scalars) if stats is not None else scalars

    return _aggregate
