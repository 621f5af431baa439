"""A stand-in for megatron.training.training, for driving loop listeners on the CPU.

It makes the calls and keeps the state that matter to the loop listeners' entries of
training/megatron_patches (training/loop_hooks' replacements), the way
megatron-core 0.19.2 does (test_mllog_run.py checks those lines of Megatron's source):
  train():    `while iteration < args.train_iters`, consumed_train_samples += global batch,
              evaluate_and_print_results every eval_interval while args.do_valid, a checkpoint
              every save_interval
  pretrain(): build_train_valid_test_data_iterators (the first reading of the data), train(),
              then a final checkpoint unless the last iteration was just saved, then a
              validation when args.do_valid
  evaluate_and_print_results() calls evaluate() through the module, as Megatron's global lookup.
"""
from __future__ import annotations

import types


class FakeMegatron:
    def __init__(self, args, eval_losses: list[float], on_data=None):
        self.args = args
        self.losses = list(eval_losses)
        self.on_data = on_data                # called where Megatron first reads the data
        self.data_reads: list = []
        self.evaluations: list[int] = []     # iterations evaluated (in the loop and after)
        self.saves: list[int] = []
        self.module = types.ModuleType("fake_megatron_training")
        self.module.train = self._train
        self.module.build_train_valid_test_data_iterators = self._build_data_iterators
        self.module.evaluate = self._evaluate
        self.module.evaluate_and_print_results = self._evaluate_and_print_results

    def _evaluate(self, *a, **kw):
        loss = self.losses.pop(0) if self.losses else 9.0
        return {"lm loss": loss}, None, False

    def _evaluate_and_print_results(self, prefix, forward_step_func, data_iterator, model,
                                    iteration, *a, **kw):
        self.module.evaluate(forward_step_func, data_iterator, model)
        self.evaluations.append(iteration)

    def _build_data_iterators(self, provider):
        self.data_reads.append(self.on_data() if self.on_data else True)
        return None, None, None

    def _train(self, *a, **kw):
        args, iteration = self.args, 0
        while iteration < args.train_iters:
            iteration += 1
            args.consumed_train_samples += args.global_batch_size
            if args.eval_interval and iteration % args.eval_interval == 0 and args.do_valid:
                self.module.evaluate_and_print_results(f"iteration {iteration}", None, None, None,
                                                       iteration)
            if args.save and args.save_interval and iteration % args.save_interval == 0:
                self.saves.append(iteration)
        return iteration, 0.0

    def pretrain(self) -> int:
        args = self.args
        self.module.build_train_valid_test_data_iterators(None)
        iteration, _ = self.module.train()
        if args.save and iteration != 0 and iteration % args.save_interval != 0:
            self.saves.append(iteration)
        if args.do_valid:
            self.module.evaluate_and_print_results(
                f"iteration {iteration} on validation set", None, None, None, iteration)
        return iteration
