"""Convergence studies: a grid of toggle settings, everything else fixed, the same data order.

`python -m training.convergence GRID.yaml` (docs/convergence.md). grid.py reads the grid file,
runner.py runs each cell through the real launcher and reads its run folder back, verdict.py
judges each cell (converged / plateau / diverged) by stated rules, report.py writes the table,
the JSON with every point, and the loss-curve PNG.
"""
