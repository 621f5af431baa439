"""Platform environment presets: one place, a reason each, the user's value wins, shown with source."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from training.launch.environment import (PRESETS, UNTOUCHED, markdown_table,
                                         resolve_environment)
from training.launch.settings import LaunchError
from training.platforms import PLATFORMS

from ..launch.helpers import launch

DOC = Path(__file__).resolve().parents[2] / "docs" / "launch.md"


def names(env):
    return set(env)


def test_nvidia_gets_the_cuda_presets_and_none_of_amds():
    env = resolve_environment("nvidia", {}, fsdp=False, platform="b300",
                              backend="transformer_engine")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == ("expandable_segments:True", "platform",
                                              env["PYTORCH_CUDA_ALLOC_CONF"][2])
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"][:2] == ("1", "platform")
    assert not names(env) & {"HSA_NO_SCRATCH_RECLAIM", "GPU_MAX_HW_QUEUES", "NVTE_CK_USES_BWD_V3",
                             "HIP_FORCE_DEV_KERNARG"}


def test_amd_gets_hip_and_hsa_presets_and_platform_specific_ones_only_on_their_platform():
    mi355 = resolve_environment("amd", {}, fsdp=False, platform="mi355x",
                                backend="transformer_engine")
    mi300 = resolve_environment("amd", {}, fsdp=False, platform="mi300x",
                                backend="transformer_engine")
    for env in (mi355, mi300):
        assert env["HSA_NO_SCRATCH_RECLAIM"][:2] == ("1", "platform")
        assert env["GPU_MAX_HW_QUEUES"][:2] == ("2", "platform")
        assert env["NVTE_CK_USES_BWD_V3"][:2] == ("1", "platform")
        assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" in mi300 and "NVTE_CK_IS_V3_ATOMIC_FP32" not in mi355


def test_te_only_presets_are_left_out_for_the_native_backend():
    env = resolve_environment("amd", {}, fsdp=False, platform="mi300x", backend="native")
    assert "NVTE_CK_USES_BWD_V3" not in env and "NVTE_CK_IS_V3_ATOMIC_FP32" not in env
    assert "HSA_NO_SCRATCH_RECLAIM" in env


def test_the_users_value_wins_and_says_so():
    env = resolve_environment("amd", {"GPU_MAX_HW_QUEUES": "4"}, fsdp=False, platform="mi355x")
    value, source, reason = env["GPU_MAX_HW_QUEUES"]
    assert (value, source) == ("4", "env")
    assert "would be 2" in reason


def test_users_nccl_variables_are_recorded_unchanged_and_nvls_is_never_preset():
    for vendor, platform in (("nvidia", "b300"), ("nvidia", "h200"), ("amd", "mi355x"),
                             (None, None)):
        env = resolve_environment(vendor, {}, fsdp=False, platform=platform)
        assert not names(env) & set(UNTOUCHED), (vendor, platform)
    env = resolve_environment("nvidia", {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "ib0",
                                         "UNRELATED": "x"}, fsdp=False)
    assert env["NCCL_NVLS_ENABLE"][:2] == ("0", "env")
    assert env["NCCL_SOCKET_IFNAME"][:2] == ("ib0", "env")
    assert "UNRELATED" not in env
    assert all(p.name not in UNTOUCHED for p in PRESETS)


def test_fsdp_leaves_max_connections_unset_and_refuses_a_user_value_of_1(tmp_path):
    from training.launch.resolve import resolve

    env = resolve_environment("nvidia", {}, fsdp=True)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env
    with pytest.raises(LaunchError, match=r"\[environment\] FSDP=1 but CUDA_DEVICE_MAX_CONN"):
        resolve("llama3", {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "FSDP": "1", "DRY_RUN": "1",
                           "EXPERIMENT_DIR": str(tmp_path)})
    assert resolve_environment("nvidia", {"CUDA_DEVICE_MAX_CONNECTIONS": "8"},
                               fsdp=True)["CUDA_DEVICE_MAX_CONNECTIONS"][:2] == ("8", "env")


def test_no_gpu_known_gets_only_the_vendor_neutral_preset():
    env = resolve_environment(None, {}, fsdp=False)
    assert set(env) == {"TOKENIZERS_PARALLELISM"}


def test_every_preset_has_a_reason_and_names_real_vendors_and_platforms():
    seen = set()
    for preset in PRESETS:
        assert preset.name not in seen, f"{preset.name} defined twice"
        seen.add(preset.name)
        assert len(preset.reason) > 20, preset.name
        assert set(preset.vendors) <= {"nvidia", "amd", None}, preset.name
        for platform in preset.platforms:
            assert platform in PLATFORMS, platform
            assert PLATFORMS[platform].vendor in preset.vendors, (preset.name, platform)


def test_a_launch_shows_the_presets_in_the_table_and_manifest_with_their_source(base_env):
    from training.launch.manifest import launch_manifest
    from training.launch.report import print_report

    result = launch(base_env, PLATFORM="mi355x", HIP_FORCE_DEV_KERNARG="0")
    assert result.env["HSA_NO_SCRATCH_RECLAIM"][:2] == ("1", "platform")
    assert result.env["HIP_FORCE_DEV_KERNARG"][:2] == ("0", "env")
    out = io.StringIO()
    print_report(result, out)
    row = next(line for line in out.getvalue().splitlines() if "HSA_NO_SCRATCH_RECLAIM" in line)
    assert "platform" in row and "ENV" in row
    env = launch_manifest(result)["environment"]
    assert env["HIP_FORCE_DEV_KERNARG"]["source"] == "env"
    assert env["GPU_MAX_HW_QUEUES"] == {"value": "2", "source": "platform",
                                        "reason": env["GPU_MAX_HW_QUEUES"]["reason"]}


def test_a_launch_with_fsdp_and_max_connections_1_is_refused_before_gpus(base_env):
    fsdp = dict(PLATFORM="b300", FSDP="1", DISTRIBUTED_OPTIMIZER="0", OVERLAP_PARAM_GATHER="0",
                GRADIENT_ACCUMULATION_FUSION="0")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in launch(base_env, **fsdp).env
    with pytest.raises(LaunchError, match="FSDP=1 but CUDA_DEVICE_MAX_CONNECTIONS=1"):
        launch(base_env, **fsdp, CUDA_DEVICE_MAX_CONNECTIONS="1")


def test_docs_preset_table_is_the_generated_one():
    text = DOC.read_text()
    block = re.search(r"<!-- presets:begin -->\n(.*?)<!-- presets:end -->", text, re.S)
    assert block, "docs/launch.md has no presets block"
    assert block.group(1) == markdown_table(), (
        "docs/launch.md's preset table is stale: paste `python -m training.launch.environment`")
