"""Issue 38's catalogue: what a security reviewer and a demanding user try, class by class.

  injection   metacharacters in every word and variable a launcher path takes: nothing runs,
              and what reaches docker/srun/the script is the word itself (data, never shell)
  secrets     a secret by name (DB_PASS, API_KEYS, GITHUB_PAT, ...) or by value (user:pw@,
              ?token=): never on stdout/stderr, in a file, or on a docker/srun argv
  loss        a run folder, tokenizer folder or checkpoint folder that is not ours is refused
              and left as it was
  tracebacks  files the project writes, read back broken: one line naming file and field
  silent      what used to be accepted and fail after torchrun (or pass as a success)

The Case type and the runners are tests/bad_input.py's.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bad_input import (MARKER, PAYLOADS, REPO, SECRET, SLURM, Case, check_case,
                             everything_written, fake_tools, mlperf_log, recorded, run,
                             snapshot, write)

LAUNCH = "training.launch.__main__"
TRAIN3 = "examples/llama/train_llama3.sh"
DOCKER = "launchers/docker_run.sh"
SBATCH = "launchers/slurm/train.sbatch"
NODE = "launchers/slurm/node.sh"
DRY = {"DRY_RUN": "1", "PLATFORM": "h200", "HF_HUB_OFFLINE": "1", "EXPERIMENT_DIR": "{tmp}/exp"}
TINY = ("MODEL_SIZE=tiny", "GPUS_PER_NODE=1")


def _l3(*words: str) -> list[str]:
    return ["--family", "llama3", *TINY, *words]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A folder with a small word-level tokenizer.json (its end-of-text token included)."""
    from tokenizers import Tokenizer, models

    folder = tmp_path_factory.mktemp("tok")
    Tokenizer(models.WordLevel({"<|end_of_text|>": 0, "a": 1, "b": 2}, unk_token="a")).save(
        str(folder / "tokenizer.json"))
    return folder


def _bash(tmp: Path, script: str, words: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {"HOME": str(tmp), "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "COLUMNS": "250",
            **fake_tools(tmp), **{k: v.replace("{tmp}", str(tmp)) for k, v in env.items()}}
    return subprocess.run(["bash", str(REPO / script), *words], env=full, cwd=tmp,
                          capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------- injection

# (id, script, words before the payload, environment); the payload rides as a word's value, a
# word's name, and a variable's value
INJECTION_PATHS = [
    ("docker DRY_RUN", DOCKER, [TRAIN3], {"DRY_RUN": "1", "PLATFORM": "h200"}),
    ("docker run", DOCKER, [TRAIN3], {}),
    ("sbatch run", SBATCH, [TRAIN3], SLURM),
    ("sbatch DRY_RUN", SBATCH, [TRAIN3, *TINY], {**SLURM, "DRY_RUN": "1", "PLATFORM": "h200"}),
    ("node.sh DRY_RUN", NODE, [str(REPO / TRAIN3), *TINY], {**SLURM, "DRY_RUN": "1", "PLATFORM": "h200"}),
    ("train_llama3.sh DRY_RUN", TRAIN3, [*TINY], DRY),
]


@pytest.mark.parametrize("path", INJECTION_PATHS, ids=[p[0] for p in INJECTION_PATHS])
def test_no_launcher_path_evaluates_what_a_user_typed(path, tmp_path):
    """Every payload as a word's value (a plain and a secret name), as a word's name, and in a
    variable the launcher passes on: nothing runs; a run that starts hands the words on as
    typed."""
    _id, script, words, env = path
    payload_words = [f"EXP_NAME={PAYLOADS[0]}", *(f"X_TOKEN={p}" for p in PAYLOADS),
                     "A;touch PWNED;B_TOKEN=1"]
    proc = _bash(tmp_path, script, [*words, *payload_words[:-1]],
                 {**env, "NCCL_DEBUG": PAYLOADS[1], "DOCKER_ENV": "HF_TOKEN"})
    assert not (tmp_path / MARKER).exists(), proc.stderr[-2000:]
    argv, child_env = recorded(tmp_path, "docker" if "docker" in script else "srun")
    if argv:   # the run started: the words arrived as data (a secret's by environment)
        assert f"EXP_NAME={PAYLOADS[0]}" in argv
        assert child_env.get("X_TOKEN") == PAYLOADS[-1] and "X_TOKEN" not in " ".join(
            a for a in argv if a.startswith("X_TOKEN="))
    odd = _bash(tmp_path, script, [*words, payload_words[-1]], env)
    assert not (tmp_path / MARKER).exists(), odd.stderr[-2000:]
    assert "Traceback" not in proc.stderr + odd.stderr


def test_launchers_run_only_the_repositorys_examples(tmp_path):
    """A script named on the command line is run by no launcher path (DRY_RUN included) unless
    it is one of the repository's example entry points."""
    evil = tmp_path / "train_evil.sh"
    evil.write_text(f"touch {tmp_path / MARKER}\n")
    for script, words, env in ((SBATCH, [str(evil)], {**SLURM, "DRY_RUN": "1"}),
                               (SBATCH, [str(evil)], SLURM),
                               (NODE, [str(evil)], {**SLURM, "DRY_RUN": "1"}),
                               (DOCKER, [str(evil)], {"DRY_RUN": "1", "PLATFORM": "h200"}),
                               (SBATCH, ["examples/lib/launch.sh"], {**SLURM, "DRY_RUN": "1"})):
        proc = _bash(tmp_path, script, words, env)
        assert proc.returncode == 2 and "not an example entry point" in proc.stderr, proc.stderr
        assert not (tmp_path / MARKER).exists()
        assert not recorded(tmp_path, "srun")[0]


def test_the_launch_exports_only_names_bash_can_take():
    """A variable of a passed-on family whose name is not a shell name never reaches the
    script's eval (the launch's one eval is of quoted values under fixed names)."""
    from training.launch.environment import resolve_environment

    env = resolve_environment("nvidia", {"NCCL_X;touch PWNED;Y": "1", "NCCL_DEBUG": "INFO"}, False)
    assert "NCCL_DEBUG" in env and not any(";" in name for name in env)


# ----------------------------------------------------------------------------- secrets

NAMES = ("DB_PASS", "API_KEYS", "GITHUB_PAT", "SSH_PASSPHRASE", "MY_PASSWD", "SLACK_AUTH",
         "NPM_CREDENTIALS", "HF_TOKEN")


@pytest.mark.parametrize("name", NAMES)
def test_a_secret_word_is_in_no_table_manifest_or_docker_line(name, tmp_path):
    proc = _bash(tmp_path, TRAIN3, [*TINY, f"{name}={SECRET}"], DRY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert SECRET not in proc.stdout.split("LAUNCH_LINE")[0] + proc.stderr
    assert SECRET not in everything_written(tmp_path / "exp")
    assert name in proc.stderr   # the table still lists it, masked
    docker = _bash(tmp_path, DOCKER, [TRAIN3, f"{name}={SECRET}"], {"DRY_RUN": "1", "PLATFORM": "h200"})
    assert docker.returncode == 0 and SECRET not in docker.stdout + docker.stderr
    assert f"-e {name}" in docker.stdout


@pytest.mark.parametrize("word", [f"MASTER_ADDR=admin:{SECRET}@10.0.0.1",
                                  f"TOKENIZER_MODEL=https://u:{SECRET}@hub.example/m",
                                  f"TOKENIZER_MODEL=https://hub.example/m?token={SECRET}",
                                  f"MY_VAR=hf_{SECRET}abcdefghijklmnop"])
def test_a_credential_inside_a_value_is_masked_or_refused(word, tmp_path):
    """A value that carries a credential: a toggle's (it would be a torchrun argument) is
    refused, masked; a passed-through variable travels by environment, masked in the table."""
    proc = _bash(tmp_path, TRAIN3, [*TINY, word], DRY)
    assert SECRET not in proc.stdout.split("LAUNCH_LINE")[0] + proc.stderr
    assert SECRET not in everything_written(tmp_path)
    assert "Traceback" not in proc.stderr


def test_secrets_travel_by_environment_to_docker_and_srun(tmp_path):
    docker = _bash(tmp_path, DOCKER, [TRAIN3, f"HF_TOKEN={SECRET}", f"DB_PASS={SECRET}"],
                   {"MASTER_ADDR": f"admin:{SECRET}@node0"})
    argv, env = recorded(tmp_path, "docker")
    assert docker.returncode == 0, docker.stderr
    assert SECRET not in " ".join(argv) and env["HF_TOKEN"] == SECRET == env["DB_PASS"]
    assert argv[argv.index("HF_TOKEN") - 1] == "-e" and "MASTER_ADDR" in argv
    srun = _bash(tmp_path, SBATCH, [TRAIN3, f"HF_TOKEN={SECRET}", "TP=1"], SLURM)
    argv, env = recorded(tmp_path, "srun")
    assert srun.returncode == 0, srun.stderr
    assert SECRET not in " ".join(argv) and env["HF_TOKEN"] == SECRET and "TP=1" in argv


def test_sbatch_dry_run_masks_every_line(tmp_path):
    proc = _bash(tmp_path, SBATCH, [TRAIN3, *TINY, f"GITHUB_PAT={SECRET}"],
                 {**SLURM, "DRY_RUN": "1", "PLATFORM": "h200", "EXPERIMENT_DIR": "{tmp}/exp"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert SECRET not in proc.stdout + proc.stderr + everything_written(tmp_path / "exp")


# ----------------------------------------------------------------------------- data loss

VICTIM = write("victim/manifest.json", '{"mine": true}\n')
LOSS: list[Case] = [
    Case("LOG_DIR: a folder that is not a run folder", LAUNCH, _l3("LOG_DIR={tmp}/victim"),
         "is not a run folder", setup=VICTIM, env=DRY),
    Case("LOG_DIR: a/b/../../victim", LAUNCH, _l3("LOG_DIR={tmp}/a/b/../../victim"), "'..'",
         setup=VICTIM, env=DRY),
    # --no-manifest: were the check ever lost, this test still writes nothing into the system
    Case("LOG_DIR=/etc", LAUNCH, ["--no-manifest", *_l3("LOG_DIR=/etc")], "system folder", env=DRY),
    Case("EXPERIMENT_DIR=/usr/local", LAUNCH, ["--no-manifest", *_l3()], "system folder",
         env={**DRY, "EXPERIMENT_DIR": "/usr/local"}),
    Case("EXPERIMENT_DIR=/", LAUNCH, ["--no-manifest", *_l3()], "system folder",
         env={**DRY, "EXPERIMENT_DIR": "/"}),
    Case("LOG_DIR through a link into /usr", LAUNCH, ["--no-manifest", *_l3("LOG_DIR={tmp}/link/x")],
         "system folder", env=DRY, setup=lambda t: (t / "link").symlink_to("/usr/local")),
    Case("tokenizer wrap --out onto another tokenizer", "training.data.tokenizer",
         ["wrap", "{tok}/tokenizer.json", "--eod-token", "<|end_of_text|>", "--out", "{tmp}/victim"],
         "--overwrite", setup=write("victim/tokenizer.json", '{"another": 1}')),
    Case("SAVE onto another run's checkpoints", LAUNCH, _l3("SAVE={tmp}/victim"), "LOAD=",
         setup=write("victim/latest_checkpointed_iteration.txt", "10\n"), env=DRY),
    Case("SAVE onto an import", LAUNCH, _l3("SAVE={tmp}/victim"), "PRETRAINED_CHECKPOINT=",
         setup=write("victim/hf_import.json", "{}"), env=DRY),
    Case("SAVE onto a folder of other files", LAUNCH, _l3("SAVE={tmp}/victim"), "not checkpoints",
         setup=VICTIM, env=DRY),
]


@pytest.mark.parametrize("case", LOSS, ids=[c.id for c in LOSS])
def test_a_folder_that_is_not_ours_is_refused_and_left_alone(case, tokenizer_dir, tmp_path, monkeypatch):
    subs = {"tok": str(tokenizer_dir)}
    if case.setup:
        case.setup(tmp_path)
    before = snapshot(tmp_path)
    check_case(Case(**{**case.__dict__, "setup": None}), tmp_path, monkeypatch, subs)
    assert snapshot(tmp_path) == before


def test_a_run_folder_of_ours_is_reused_and_a_wrap_of_the_same_tokenizer_is_kept(
        tokenizer_dir, tmp_path, monkeypatch):
    case = Case("LOG_DIR twice", LAUNCH, _l3("LOG_DIR={tmp}/mine"), "", code=0, env=DRY)
    for _ in range(2):   # a DRY_RUN's folder (manifest + marker) takes the next launch
        code, out, err, _ = run(case, tmp_path, monkeypatch)
        assert code == 0, err
    assert (tmp_path / "mine" / ".launcher-run").is_file()
    from training.data.tokenizer import wrap

    for _ in range(2):
        wrap(str(tokenizer_dir / "tokenizer.json"), "<|end_of_text|>", str(tmp_path / "w"))


# ----------------------------------------------------------------------------- tracebacks

SUMMARY = "training.mlperf.summary"
TRACEBACKS: list[Case] = [
    Case("mlperf summary: eval_accuracy a string", SUMMARY, ["{tmp}/mlperf.log"], "value",
         setup=write("mlperf.log", mlperf_log("abc"))),
    Case("mlperf summary: JSON nested 100000 deep", SUMMARY, ["{tmp}/mlperf.log"], "too deep",
         setup=write("mlperf.log", ":::MLLOG " + "[" * 100000 + "]" * 100000 + "\n")),
    Case("mlperf summary: manifest target a string", SUMMARY, ["{tmp}"], "mlperf.target_eval_loss",
         setup=lambda t: (write("mlperf.log", mlperf_log())(t),
                          write("manifest.json", '{"mlperf": {"target_eval_loss": "abc"}}')(t))),
    Case("mlperf summary: --out cannot be made", SUMMARY, ["{tmp}/mlperf.log", "--out", "/proc/x38"],
         "--out", setup=write("mlperf.log", mlperf_log())),
    Case("mlperf summary: --out name too long", SUMMARY,
         ["{tmp}/mlperf.log", "--out", "{tmp}/" + "a" * 300], "--out", setup=write("mlperf.log", mlperf_log())),
    Case("bench table: JSON nested 100000 deep", "training.bench.__main__", ["table", "{tmp}/b.json"],
         "too deep", setup=write("b.json", "[" * 100000 + "]" * 100000)),
    Case("trace_report: a trace nested 100000 deep", "training.profiling.trace_report", ["{tmp}/t.json"],
         "too deep", setup=write("t.json", "[" * 100000 + "]" * 100000)),
    Case("convergence: a grid nested 100000 deep", "training.convergence.__main__", ["{tmp}/g.yaml"],
         "too deep", setup=write("g.yaml", "[" * 100000 + "]" * 100000)),
    Case("launch: LOG_DIR holding a manifest nested 100000 deep", LAUNCH, _l3("LOG_DIR={tmp}/run"),
         "not a run folder", env=DRY, setup=write("run/manifest.json", "[" * 100000 + "]" * 100000)),
    Case("optimize: manifest nested 100000 deep", "training.optimize.__main__", ["{tmp}/run"], "too deep",
         setup=write("run/manifest.json", "[" * 100000 + "]" * 100000)),
    Case("checkpoint import: rope_theta a string", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out"], "rope_theta",
         setup=write("hf/config.json", json.dumps({
             "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "vocab_size": 256,
             "num_attention_heads": 4, "num_hidden_layers": 2, "rope_theta": "abc"}))),
    Case("launch: hf_import.json of the wrong types", LAUNCH, _l3("PRETRAINED_CHECKPOINT={tmp}/imp"),
         "hf_import.json: preset", env=DRY, setup=lambda t: (
             write("imp/latest_checkpointed_iteration.txt", "release\n")(t), (t / "imp/release").mkdir(),
             write("imp/hf_import.json", '{"preset": 5, "num_layers": "x", "preset_fields": []}')(t))),
    Case("launch: EXPERIMENT_DIR name too long", LAUNCH, _l3(), "File name too long",
         env={**DRY, "EXPERIMENT_DIR": "{tmp}/" + "a" * 300}),
]


@pytest.mark.parametrize("case", TRACEBACKS, ids=[c.id for c in TRACEBACKS])
def test_a_broken_file_of_ours_is_one_line(case, tmp_path, monkeypatch):
    check_case(case, tmp_path, monkeypatch, quiet_stdout=case.tool == LAUNCH)


# ----------------------------------------------------------------------------- silent acceptances

def _load(tracker: str, folder: str | None = None):
    def setup(tmp: Path) -> None:
        write("ck/latest_checkpointed_iteration.txt", tracker + "\n")(tmp)
        if folder:
            (tmp / "ck" / folder).mkdir()
    return setup


SILENT: list[Case] = [
    *[Case(f"LOAD tracker {t!r} names nothing", LAUNCH, _l3("LOAD={tmp}/ck"), needle, env=DRY,
           setup=_load(t)) for t, needle in (("abc", "neither an iteration"), ("7", "iter_0000007/"),
                                             ("release", "release/"))],
    Case("PRETRAINED_CHECKPOINT tracker names nothing", LAUNCH, _l3("PRETRAINED_CHECKPOINT={tmp}/ck"),
         "iter_0000003/", env=DRY, setup=lambda t: (_load("3")(t), write("ck/hf_import.json", "{}")(t))),
    Case("LOAD= empty", LAUNCH, _l3("LOAD="), "LOAD= is empty", env=DRY),
    Case("SAVE= empty", LAUNCH, _l3("SAVE="), "SAVE= is empty", env=DRY),
    Case("TP given twice as words", LAUNCH, _l3("TP=1", "TP=2"), "TP is given twice", env=DRY),
    Case("docker: TP given twice", "training.deploy.docker", [TRAIN3, "TP=1", "TP=2"], "given twice",
         env={"DRY_RUN": "1", "PLATFORM": "h200"}),
    Case("Megatron flag typo", LAUNCH, _l3("--log-param-norm"), "did you mean --log-params-norm?",
         env=DRY),
    Case("LR_DECAY_ITERS below the warm-up", LAUNCH, _l3("WARMUP_ITERS=10", "LR_DECAY_ITERS=5"),
         "LR_DECAY_ITERS=5", env=DRY),
    Case("CUDA_VISIBLE_DEVICES=0,0", LAUNCH, _l3(), "more than once",
         env={**DRY, "CUDA_VISIBLE_DEVICES": "0,0"}),
    Case("CUDA_VISIBLE_DEVICES=0,,1", LAUNCH, _l3(), "empty entry",
         env={**DRY, "CUDA_VISIBLE_DEVICES": "0,,1"}),
    Case("MASTER_ADDR with a scheme", LAUNCH, _l3("MASTER_ADDR=http://node0:29500"), "without a scheme",
         env=DRY),
    Case("MASTER_ADDR with a port", LAUNCH, _l3("MASTER_ADDR=node0:29500"), "MASTER_PORT", env=DRY),
    Case("slurm: MASTER_ADDR with a scheme", "training.deploy.cluster", ["slurm-env"], "without a scheme",
         setup=fake_tools, env={**SLURM, "MASTER_ADDR": "http://gpu001", "PATH": "{tmp}/bin:/usr/bin:/bin"}),
    Case("mlperf summary: NaN final eval called success", SUMMARY, ["{tmp}/mlperf.log"],
         "not a valid result", setup=write("mlperf.log", mlperf_log(float("nan")))),
    Case("mlperf summary: negative time to train called success", SUMMARY, ["{tmp}/mlperf.log"],
         "not a valid result", setup=write("mlperf.log", mlperf_log(stop_after_ms=-60_000))),
    Case("mlperf summary: above the target called success", SUMMARY, ["{tmp}/mlperf.log", "--target", "3.0"],
         "above the target", setup=write("mlperf.log", mlperf_log(3.5))),
]


@pytest.mark.parametrize("case", SILENT, ids=[c.id for c in SILENT])
def test_what_would_fail_after_torchrun_is_refused_before(case, tmp_path, monkeypatch):
    check_case(case, tmp_path, monkeypatch, quiet_stdout=case.tool == LAUNCH)


@pytest.mark.parametrize("word", ["WEIGHT_DECAY=1000", "LR=5", "ADAM_EPS=0.1", "CLIP_GRAD=1e6"])
def test_an_implausible_optimizer_value_is_warned_about(word, tmp_path):
    from training.launch.resolve import resolve

    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in DRY.items()}
    launch = resolve("llama3", env, [*TINY, word, "MIN_LR=0"])
    warned = [n.message for n in launch.settings.notices if n.guard == "implausible_values"]
    assert len(warned) == 1 and warned[0].startswith(word.split("=")[0])
    assert not [n for n in resolve("llama3", env, [*TINY]).settings.notices
                if n.guard == "implausible_values"]
