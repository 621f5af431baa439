"""The version manifest with fake machines: CUDA, ROCm, missing pieces, the docker build check."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from training import versions as V


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class FakeProbe(V.Probe):
    def __init__(self, dists=None, modules=None, torch=None, commands=None, files=None, env=None):
        self.dists = {normalise(k): v for k, v in (dists or {}).items()}
        self.modules = modules or {}          # module -> __version__ (None: no attribute)
        self._torch = torch
        self.commands = commands or {}        # argv[0] -> stdout
        self.files = files or {}
        self.environ = env or {}
        self.torch_calls = 0

    def distribution(self, name):
        return self.dists.get(normalise(name))

    def module_version(self, module):
        return self.modules.get(module)

    def installed(self, module):
        return any(m.split(".")[0] == module for m in self.modules)

    def torch(self):
        self.torch_calls += 1
        return self._torch

    def run(self, argv):
        return self.commands.get(argv[0])

    def read(self, path):
        return self.files.get(path)

    def env(self, name):
        return self.environ.get(name)


def fake_torch(version="2.11.0a0+nv26.03", cuda="13.2", hip=None, nccl=(2, 28, 9),
               device="NVIDIA B300", count=8, available=True, driver_api=13020):
    def nccl_version():
        if isinstance(nccl, Exception):
            raise nccl
        return nccl

    return SimpleNamespace(
        __version__=version, version=SimpleNamespace(cuda=cuda, hip=hip),
        backends=SimpleNamespace(cudnn=SimpleNamespace(is_available=lambda: True,
                                                       version=lambda: 91300)),
        cuda=SimpleNamespace(nccl=SimpleNamespace(version=nccl_version),
                             is_available=lambda: available,
                             get_device_name=lambda: device, device_count=lambda: count),
        _C=SimpleNamespace(_cuda_getDriverVersion=lambda: driver_api))


CUDA_DISTS = {"megatron-core": "0.19.2", "transformer_engine": "2.12.0+abc", "apex": "0.1",
              "liger_kernel": "0.8.5", "triton": "3.6.0"}


def test_a_cuda_machine():
    probe = FakeProbe(dists=CUDA_DISTS, torch=fake_torch(),
                      commands={"nvidia-smi": "580.95.05\n580.95.05\n"})
    v = V.collect_versions(probe)
    assert set(V.KEYS) <= set(v)
    assert v["torch"] == "2.11.0a0+nv26.03" and v["cuda"] == "13.2" and v["hip"] is None
    assert v["megatron-core"] == "0.19.2" and v["transformer-engine"] == "2.12.0+abc"
    assert v["apex"] == "0.1" and v["liger-kernel"] == "0.8.5"
    assert v["nccl"] == "2.28.9" and v["rccl"] is None
    assert v["driver"] == "580.95.05" and v["cudnn"] == "91300"
    assert v["device"] == "NVIDIA B300" and v["device_count"] == 8
    assert v["rocm"] is None and v["aiter"] is None


def test_a_rocm_machine_reports_rccl_hip_rocm_and_the_amdgpu_driver():
    probe = FakeProbe(dists={"amd-aiter": "0.1.14.post1", "transformer_engine": "2.17.0+rocm10.0.0",
                             "megatron-core": "0.19.2"},
                      torch=fake_torch(version="2.12.0+rocm10.0.0", cuda=None, hip="10.0.12345",
                                       nccl=(2, 30, 4), device="AMD Instinct MI355X"),
                      files={"/sys/module/amdgpu/version": "6.16.6\n",
                             "/opt/rocm/.info/version": "10.0.0-71\n"},
                      commands={"nvidia-smi": "should not be asked\n"})
    v = V.collect_versions(probe)
    assert v["rccl"] == "2.30.4" and v["nccl"] is None
    assert v["hip"] == "10.0.12345" and v["rocm"] == "10.0.0-71" and v["cuda"] is None
    assert v["driver"] == "6.16.6" and v["aiter"] == "0.1.14.post1"


def test_amd_driver_from_amd_smi_when_the_module_file_is_absent():
    probe = FakeProbe(torch=fake_torch(cuda=None, hip="7.0.1"),
                      commands={"amd-smi": "AMDSMI Tool: 26.0.1 | AMDSMI Library version: 26.0 | "
                                           "ROCm version: 7.0.1 | amdgpu version: 6.12.12 | "})
    assert V.collect_versions(probe)["driver"] == "6.12.12"


def test_nvidia_driver_falls_back_to_proc_then_to_torchs_driver_api():
    proc = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Wed May 21 2025\nGCC version: gcc 12\n")
    v = V.collect_versions(FakeProbe(torch=fake_torch(),
                                     files={"/proc/driver/nvidia/version": proc}))
    assert v["driver"] == "575.57.08"
    v = V.collect_versions(FakeProbe(torch=fake_torch(driver_api=12080)))
    assert v["driver"] == "CUDA driver API 12.8"


def test_missing_pieces_are_none_never_an_error():
    v = V.collect_versions(FakeProbe())
    assert v["python"]
    assert all(v[k] is None for k in V.KEYS if k != "python")
    broken = fake_torch(nccl=RuntimeError("no libnccl"), available=False)
    v = V.collect_versions(FakeProbe(torch=broken))
    assert v["torch"] == "2.11.0a0+nv26.03" and v["nccl"] is None and v["device"] is None


def test_source_installs_report_their_module_version_or_installed():
    probe = FakeProbe(modules={"megatron.core.package_info": "0.15.0rc0", "apex": None},
                      torch=fake_torch())
    v = V.collect_versions(probe)
    assert v["megatron-core"] == "0.15.0rc0"
    assert v["apex"] == "installed (version unknown)"


def test_launcher_versions_never_import_torch():
    probe = FakeProbe(dists={"torch": "2.11.0", **CUDA_DISTS}, torch=fake_torch(),
                      commands={"nvidia-smi": "580.95.05\n"})
    v = V.launcher_versions(probe)
    assert probe.torch_calls == 0
    assert v["torch"] == "2.11.0" and v["driver"] == "580.95.05" and v["nccl"] is None


def test_format_versions_is_one_line_of_known_entries():
    line = V.format_versions({"torch": "2.11.0", "apex": None, "nccl": "2.28.9"})
    assert line == "torch 2.11.0, nccl 2.28.9"


def test_unchanged_check_fails_on_a_downgraded_transformer_engine(tmp_path, monkeypatch, capsys):
    before = {"torch": "2.11.0a0", "transformer-engine": "2.12.0", "apex": "0.1"}
    (tmp_path / "base.json").write_text(json.dumps(before))
    after = dict(before, **{"transformer-engine": "2.8.0"})
    monkeypatch.setattr(V, "collect_versions", lambda import_torch=True: dict(after))
    assert V.main(["unchanged", str(tmp_path / "base.json"), "torch", "apex"]) == 0
    assert V.main(["unchanged", str(tmp_path / "base.json"), "torch",
                   "transformer-engine"]) == 1
    assert "transformer-engine: 2.12.0 -> 2.8.0" in capsys.readouterr().err


def test_require_names_what_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(V, "collect_versions",
                        lambda import_torch=True: {"torch": "2.11", "apex": None})
    assert V.main(["--require", "torch"]) == 0
    assert V.main(["--require", "torch,apex"]) == 1
    assert "missing here: apex" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["torch", "megatron-core"])
def test_this_venv_reports_its_own_packages(entry):
    assert V.launcher_versions()[entry]


def test_the_launchers_manifest_records_the_stack_without_torch(base_env, monkeypatch):
    from training.launch.manifest import launch_manifest

    from ..launch.helpers import launch

    monkeypatch.setattr(V.Probe, "torch", lambda self: pytest.fail("the launcher imported torch"))
    recorded = launch_manifest(launch(base_env, MODEL_SIZE="tiny"))["versions"]
    assert set(V.KEYS) <= set(recorded)
    assert recorded["megatron-core"] == "0.19.2" and recorded["python"]
