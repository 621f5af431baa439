"""A submission of synthesized closed runs through the real checkers: mlperf-logging's package
checker (system description, compliance of each result, the seed checker), its RCP checker, and
this recipe's rules through its compliance checker. Ten runs pass all three; a duplicated seed,
a validation set of other tokens, cache_clear false and a batch size without an RCP each fail,
with the checker's own message."""
from __future__ import annotations

import json
import re

import pytest

from training.mlperf import rcp, rules, seed, submission

from .synth import CountedDataset, losses_reaching, run_fake

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

# The RCP of BS 32 converges in 172,032 to 196,608 samples: the 14th to 16th evaluation
# (every 12,288 samples). Each synthesized run reaches the target at one of them.
CONVERGED_AT = [15, 14, 15, 16, 15, 14, 15, 15, 16, 15]
ORG, PLATFORM = "Example Org", "1xNVIDIA H200 (test)"


def _reference_valid():
    ref = rules.load().reference_data
    return CountedDataset(ref["eval_dataset_documents"], ref["eval_dataset_tokens"])


def _run(env, tmp_path, i, at, valid=None, **toggles):
    """One closed run of the recipe (its seed drawn by the launch), converging at the `at`-th
    evaluation."""
    env = dict(env, EXPERIMENT_DIR=str(tmp_path / "exp"), RUN_ID=f"run{i}", MLPERF_ORG=ORG,
               MLPERF_PLATFORM=PLATFORM, GPUS_PER_NODE="8", MLPERF_CACHE_CLEAR_CMD="true",
               **toggles)
    _, _, _, log = run_fake(env, losses_reaching(3.3, at),
                            datasets=(CountedDataset(1000, 10**6), valid or _reference_valid()))
    return log


@pytest.fixture(scope="module")
def ten_runs(tmp_path_factory, mlperf_data):
    tmp = tmp_path_factory.mktemp("ten")
    env = {**mlperf_data, "DRY_RUN": "1"}
    env.pop("SMALL_VALID")
    return env, [_run(env, tmp, i, at) for i, at in enumerate(CONVERGED_AT)]


def _submit(logs, out, **kw):
    return submission.assemble([log.parent for log in logs], out, ORG, PLATFORM, **kw)


def _by_name(checks):
    return {c.name: c for c in checks}


def test_ten_closed_runs_pass_every_checker(ten_runs, tmp_path):
    _, logs = ten_runs
    root = _submit(logs, tmp_path)
    results = sorted((root / "results").glob("*/llama31_8b/result_*.txt"))
    assert [p.name for p in results] == [f"result_{i}.txt" for i in range(10)]
    desc = json.loads(next((root / "systems").glob("*.json")).read_text())
    assert desc["submitter"] == ORG and desc["system_name"] == PLATFORM
    assert desc["division"] == "closed" and set(submission.SYSTEM_FIELDS) <= set(desc)

    checks = _by_name(submission.check(root))
    assert all(c.passed for c in checks.values()), submission.render(list(checks.values()))
    package = "\n".join(checks["package_checker"].messages)
    assert "Seed checker failed" not in package
    assert any("RCP found" in m or "RCP Interpolation" in m for m in checks["rcp_checker"].messages)
    assert submission.main(["check", str(root)]) == 0


def test_ten_runs_drew_ten_seeds(ten_runs):
    _, logs = ten_runs
    seeds = [next(e["value"] for e in _events(log) if e["key"] == "seed") for log in logs]
    assert len(set(seeds)) == 10 and all(1 <= s < seed.LIMIT for s in seeds)


def test_a_duplicated_seed_fails_the_seed_checker(ten_runs, tmp_path):
    _, logs = ten_runs
    taken = next(e["value"] for e in _events(logs[0]) if e["key"] == "seed")
    root = _submit(logs, tmp_path / "sub")
    twin = next((root / "results").glob("*/llama31_8b/result_1.txt"))
    twin.write_text(re.sub(r'("key": "seed", "value": )\d+', rf"\g<1>{taken}", twin.read_text()))
    checks = _by_name(submission.check(root))
    assert not checks["package_checker"].passed
    text = "\n".join(checks["package_checker"].messages)
    assert "Seed checker failed" in text
    assert f"logs seed {taken} on" in text and "already logs the same seed on the same line" in text


def test_a_validation_set_of_other_tokens_fails_the_recipe_rules(ten_runs, tmp_path):
    env, logs = ten_runs
    ref = rules.load().reference_data
    bos_eos = CountedDataset(ref["eval_dataset_documents"],
                             ref["eval_dataset_tokens"] + 2 * ref["eval_dataset_documents"])
    other = _run(env, tmp_path, 98, CONVERGED_AT[1], valid=bos_eos)
    root = _submit([logs[0], other, *logs[2:]], tmp_path / "sub")
    checks = _by_name(submission.check(root))
    assert not checks["recipe_rules"].passed
    (message,) = checks["recipe_rules"].messages
    assert message.startswith("result_1.txt: eval_dataset_tokens:")
    assert f"v['value'] == {ref['eval_dataset_tokens']}" in message


def test_cache_clear_false_fails_the_recipe_rules(ten_runs, tmp_path):
    _, logs = ten_runs
    root = _submit(logs, tmp_path)
    result = next((root / "results").glob("*/llama31_8b/result_3.txt"))
    result.write_text(re.sub(r'("key": "cache_clear", "value": )true', r"\1false",
                             result.read_text()))
    checks = _by_name(submission.check(root))
    assert not checks["recipe_rules"].passed
    (message,) = checks["recipe_rules"].messages
    assert message.startswith("result_3.txt: cache_clear:") and "v['value'] == True" in message


def test_a_batch_size_without_rcp_fails_the_rcp_checker(tmp_path, mlperf_data):
    rcps = rcp.load(rules.load().ruleset)
    bs = 2 * rcps[-1].batch_size
    env = {**mlperf_data, "DRY_RUN": "1"}
    env.pop("SMALL_VALID")
    every = -(-12288 // bs)
    # converging at the largest RCP's mean number of samples, in evaluations of this BS
    mean = sum(rcps[-1].samples_to_converge) / len(rcps[-1].samples_to_converge)
    at = max(1, round(mean / (every * bs)))
    logs = [_run(env, tmp_path, i, at, BS=str(bs)) for i in range(10)]
    root = _submit(logs, tmp_path / "sub")
    checks = _by_name(submission.check(root))
    assert not checks["rcp_checker"].passed and not checks["package_checker"].passed
    assert f"Missing RCP, please submit RCP with BS = {bs}" in checks["rcp_checker"].messages[0]
    assert any(f"RCP Test Failed: Missing RCP, please submit RCP with BS = {bs}" in m
               for m in checks["package_checker"].messages)


def _events(log):
    from training.mlperf.summary import read_events

    return read_events(log)


def test_bad_input_is_one_line(tmp_path, capsys):
    assert submission.main(["check", str(tmp_path)]) == 2
    assert "no results/ folder" in capsys.readouterr().err
    assert submission.main(["assemble", "--org", "o", "--platform", "!!", "--out",
                            str(tmp_path), str(tmp_path)]) == 2
