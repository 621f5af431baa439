"""Nonsense that parses is refused or warned about with its reason (issue 55's "plausibility"):
optimizer values far outside recipes, device lists that hide GPUs, more GPUs than a node has,
blank or invisible run-folder names, sequences past a model's positions, one dataset twice or
validation on training data, a cut tokenizer.json, a DOCKER_IMAGE that is a docker option.
Each test runs over the class, not one example."""
from __future__ import annotations

import json
import os

import pytest

from training.data.check import repeated_datasets
from training.data.errors import InputError
from training.data.tokenizer import check_tokenizer_json
from training.deploy import docker as D
from training.launch.guards import PLAUSIBLE, Refusals
from training.launch.settings import LaunchError

from .helpers import launch


def _refused(base_env, guard, **env) -> str:
    with pytest.raises(Refusals) as err:
        launch(base_env, **env)
    text = str(err.value)
    assert f"[{guard}]" in text, text
    return text


def _warnings(result, guard) -> list[str]:
    return [n.message for n in result.settings.notices if n.guard == guard]


@pytest.mark.parametrize("name", sorted(PLAUSIBLE))
def test_every_implausible_optimizer_value_is_warned_with_its_reason(base_env, name):
    low, high, why = PLAUSIBLE[name]
    for value in (high * 10 + 1, 1000):
        env = {name: value, **({"LR": value} if name == "MIN_LR" else {})}  # MIN_LR <= LR
        result = launch(base_env, **env)
        said = _warnings(result, "implausible_values")
        assert any(name in m and why in m for m in said), said
    result = launch(base_env, **{name: high, **({"LR": high} if name == "MIN_LR" else {})})
    assert not any(name in m for m in _warnings(result, "implausible_values"))


@pytest.mark.parametrize("value", ["-1", "0,-1", "1,x", "GPU", "0,1;2", "0 1"])
@pytest.mark.parametrize("var", ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                 "ROCR_VISIBLE_DEVICES"])
def test_a_device_list_entry_that_is_no_device_is_refused(base_env, var, value):
    assert "not a device" in _refused(base_env, "visible_devices", **{var: value})


@pytest.mark.parametrize("value", ["0", "0,1,2,3", "GPU-8a4f1c2e-0b7d-4e51-9f0a-1234567890ab",
                                   "MIG-8a4f1c2e-0b7d-4e51-9f0a-1234567890ab"])
def test_device_indices_and_uuids_pass(base_env, value):
    result = launch(base_env, CUDA_VISIBLE_DEVICES=value)   # a refusal raises
    assert not _warnings(result, "visible_devices")


def test_more_gpus_per_node_than_the_platform_has_is_refused(base_env):
    text = _refused(base_env, "gpus_per_node", PLATFORM="h200", GPUS_PER_NODE=16)
    assert "GPUS_PER_NODE=16" in text and "8 GPUs" in text
    launch(base_env, PLATFORM="h200", GPUS_PER_NODE=8)
    launch(base_env, PLATFORM="h200", GPUS_PER_NODE=4)


INVISIBLE = {"blank": "   ", "a newline": "run\nx", "a tab": "a\tb", "a carriage return": "a\r",
             "an escape": "a\x1b[31m", "a leading space": " run", "a trailing space": "run "}


@pytest.mark.parametrize("knob", ["EXP_NAME", "RUN_ID", "EXPERIMENT_DIR", "LOG_DIR"])
@pytest.mark.parametrize("case", sorted(INVISIBLE))
def test_run_folder_names_are_visible(base_env, tmp_path, knob, case):
    value = INVISIBLE[case]
    if knob in ("EXPERIMENT_DIR", "LOG_DIR") and value.strip():
        value = str(tmp_path / value) if not value.startswith(" ") else " " + str(tmp_path / "x")
    if knob == "LOG_DIR":
        base_env = {k: v for k, v in base_env.items() if k != "EXPERIMENT_DIR"}
    with pytest.raises(LaunchError) as err:
        launch(base_env, **{knob: value})
    assert knob in str(err.value) and "Traceback" not in str(err.value)


def test_a_sequence_past_the_models_positions_is_warned(base_env):
    result = launch(base_env, MODEL_SIZE="8B", SEQ_LENGTH=4 * 8192)
    said = _warnings(result, "positions")
    assert said and "4x the 8192 positions" in said[0]
    assert not _warnings(launch(base_env, MODEL_SIZE="8B", SEQ_LENGTH=8192), "positions")


def _prefix(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    for ext in (".bin", ".idx"):
        (folder / f"{name}{ext}").write_bytes(b"")
    return str(folder / name)


def test_one_dataset_twice_or_validation_on_training_data_is_named(tmp_path):
    a, b = _prefix(tmp_path / "d", "a"), _prefix(tmp_path / "d", "b")
    os.symlink(tmp_path / "d", tmp_path / "link")
    alias = str(tmp_path / "link" / "a")
    for blend in (f"{a} {a}", f"0.5 {a} 0.5 {a}", f"{a} {b} {alias}", f"1 {a} 1 {b} 2 {alias}"):
        assert "twice" in repeated_datasets(blend)
    for valid in (a, alias, f"{b} {a}", f"1 {b} 1 {alias}"):
        assert "validation on training data" in repeated_datasets(f"{a}", valid)
    assert repeated_datasets(f"0.3 {a} 0.7 {b}") is None
    assert repeated_datasets(a, b) is None


@pytest.mark.parametrize("text", ["", "   ", '{"model": {"type": "BPE", "vocab": {', "[]",
                                  '{"version": "1.0"}', "\xff\xfe"])
def test_an_empty_or_cut_tokenizer_json_is_refused(tmp_path, text):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError) as err:
        check_tokenizer_json(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_whole_tokenizer_json_passes(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    check_tokenizer_json(str(path))


NVIDIA = D.HostFacts(nvidia=True, amd=False, infiniband=False, cwd=D.REPO_ROOT,
                     git_sha="abc")


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "a b", "img;rm -rf /",
                                   "Upper:case", "img:tag with space", "$(id)"])
def test_a_docker_image_that_is_no_image_reference_is_refused(image):
    with pytest.raises(LaunchError, match="DOCKER_IMAGE"):
        D.docker_plan({"DRY_RUN": "1", "DOCKER_IMAGE": image}, [], NVIDIA)


@pytest.mark.parametrize("size", ["--privileged", "64 g", "lots", "-1"])
def test_a_shm_size_that_is_no_size_is_refused(size):
    with pytest.raises(LaunchError, match="DOCKER_SHM_SIZE"):
        D.docker_plan({"DRY_RUN": "1", "DOCKER_SHM_SIZE": size}, [], NVIDIA)


@pytest.mark.parametrize("image", ["training:cuda", "nvcr.io/nvidia/pytorch:25.01-py3",
                                   "localhost:5000/team/train:v1",
                                   "rocm/megatron-lm@sha256:" + "0" * 64])
def test_image_references_pass(image):
    plan = D.docker_plan({"DRY_RUN": "1", "DOCKER_IMAGE": image}, [], NVIDIA)
    assert image in plan.argv


@pytest.mark.parametrize("words", [["--vpp", "4", "PP=1"], ["--vpp", "3", "PP=2"]])
def test_virtual_stages_need_a_pipeline_that_they_divide(capsys, words):
    from training.optimize.project import main

    assert main([*words, "PLATFORM=h200", "MODEL_SIZE=8B"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--vpp" in err, err


@pytest.mark.parametrize("word,field", [("MODEL_SIZE=70B", "MODEL_SIZE"),
                                        ("SEQ_LENGTH=4096", "SEQ_LENGTH"),
                                        ("NUM_LAYERS=16", "NUM_LAYERS")])
def test_a_time_to_train_is_the_benchmarks_model_only(capsys, word, field):
    from training.optimize.time_to_train import main

    assert main(["PLATFORM=h200", word]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{field}=" in err and "RCPs" in err, err
