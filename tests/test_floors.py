"""docs/architecture.md's import table is generated from the tree, and the floors hold."""
from __future__ import annotations

from training import floors

# checkpoint_scan: which checkpoints of a SAVE folder are complete (the standard library only),
# one rule for the launcher's resume plan, the atomic marker and the supervisor's restarts
# safe_files: every write of the project (no link followed, no FIFO written into); it raises
# cli's BadFile, and cli's write_text goes through it
GROUND = {"run_description", "platforms", "versions", "data", "cli", "quiet", "credentials",
          "checkpoint_scan", "safe_files"}
FAMILIES = {"mlperf", "checkpoint", "moe"}
READERS = {"bench", "optimize", "profiling", "convergence"}
RUN = {"pretrain_gpt", "arguments", "megatron_patches", "run", "specs", "native", "metrics",
       "loop_hooks", "numerics", "router_stats"}


def test_the_architecture_doc_table_is_the_generated_one():
    assert floors.main(["--check"]) == 0, "docs/architecture.md is stale: python -m training.floors"


def test_the_floors_hold():
    edges = floors.graph()
    assert edges["run_description"] == set() and edges["platforms"] == set()
    assert edges["checkpoint_scan"] == set()      # the supervisor runs it before torchrun
    assert edges["credentials"] == set() and edges["cli"] <= {"credentials", "safe_files"}
    assert edges["safe_files"] <= {"cli"}
    # no family, reader, run or deploy; but the schema layer of the files we read back
    # (records and its bounded reader, reading: they raise the launcher's error type), and the run's parser in the generator of
    # the recorded flag list (launch/megatron_flags.py, run by hand, never at launch)
    assert edges["launch"] <= GROUND | {"records", "reading", "arguments"}, edges["launch"]
    assert edges["records"] <= GROUND | {"launch", "reading"}, edges["records"]
    assert edges["reading"] <= GROUND | {"launch"}, edges["reading"]   # the bounded reader
    # beside the launcher: deployment, and the supervisor between the entry and torchrun,
    # whose exit statuses the Slurm script answers (resilience: the standard library, and the
    # checkpoint reader in its rehearsal)
    assert edges["deploy"] <= GROUND | {"launch", "resilience"}, edges["deploy"]
    assert edges["resilience"] <= GROUND | {"checkpoint"}, edges["resilience"]
    for part in GROUND:
        assert not edges[part] & ({"launch", "deploy"} | FAMILIES | READERS | RUN), part
    for part in READERS | FAMILIES | RUN:
        assert "deploy" not in edges[part], part
    assert "resilience" not in edges["launch"]     # the launcher only names its options
    for part in RUN:                                            # the run builds MoE from
        assert "moe" not in edges[part], part                   # Megatron's arguments alone


def test_the_graph_sees_lazy_and_relative_imports():
    edges = floors.graph()
    assert "data" in edges["launch"]          # `from training.data.check import ...` in a function
    assert "launch" in edges["mlperf"]        # relative and absolute


def test_no_module_of_a_script_folder_shadows_the_standard_library():
    """torchrun runs training/pretrain_gpt.py as a script, so training/ is first on sys.path
    in the worker: a training/secrets.py was imported by numpy.random as the standard
    `secrets`, torch's dynamo lost numpy, and every GPU run failed at Megatron's import
    (2026-12-03). The same holds for any folder whose files are run as scripts (dev/,
    tests/native/): every folder of the project's own code is checked."""
    import sys
    from pathlib import Path

    root = Path(floors.TRAINING).parent
    shadows = sorted(str(p.relative_to(root)) for top in ("training", "dev", "tests", "examples",
                                                          "launchers")
                     for p in (root / top).rglob("*.py")
                     if p.stem in sys.stdlib_module_names and p.stem != "__main__")
    assert not shadows, f"rename these (they shadow the standard library): {shadows}"
