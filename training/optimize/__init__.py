"""The optimize advisor: which levers to pull for one concrete run, from measured figures.

    python -m training.optimize RUN [--levers PATH] [--json PATH] [--platform NAME]
                                    [--want-seq-length N] [--want-mbs N] [--want-global-batch N]

RUN is a run folder (manifest.json, with metrics.jsonl, trace_report.json and train.log when
present) or a DRY_RUN manifest. The flow is the one an experienced performance engineer
follows (docs/optimize.md):

  1. pin the bottleneck: memory-bound (an out-of-memory in the log, an estimated or measured
     peak above 90% of the GPU's memory, or a longer sequence / bigger batch asked for) or
     throughput-bound (compute-, communication- or idle-bound from the trace report);
  2. confirm the shape: dense or MoE, short or long sequence, data, parallel layout;
  3. recommend the levers that apply, in order, each with its measured effect quoted from
     docs/levers.json (shape and source included) and the exact toggle to set; list what is
     already on by default; steer away from the dead ends for that shape.

The advisor holds no measured numbers of its own: every measured figure it prints comes from
the levers file it read, or from the run itself. Its own arithmetic (the memory estimate) is
labelled as an estimate.

  inputs.py       reading a run folder or manifest; bad input -> one line, exit 2
  config.py       the resolved configuration the advisor reasons about
  memory.py       the per-GPU memory estimator (weights, gradients, optimizer, activations,
                  logits, overhead), with its formula stated term by term
  levers.py       docs/levers.json: schema check, matching a lever to a shape, quoting it
  rules.py        the data: candidate levers per bottleneck, dead ends, defaults to confirm
  advisor.py      the flow: bottleneck -> shape -> recommendations -> report dict
  render.py       the readable report (rich)
  calibration.py  the estimator against measured peaks of real runs
"""
