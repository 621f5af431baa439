"""Every flag of megatron-core's parser has a class (training/launch/flag_classes.py), and each
class does what it says: a refused class is refused by the launcher before torchrun, a flag
that spells a launcher setting agrees with it or is refused naming it, and the native
backend's "honoured" claims hold where the CPU can show them (issue 51, issue 55)."""
from __future__ import annotations

import json

import pytest

from training.launch import flag_classes as fc
from training.launch.guards import Refusals
from training.launch.layers import registry_with
from training.launch.megatron_flags import RECORD
from training.launch.toggles import REGISTRY
from training.launch.userflags import flag_owners

from .helpers import launch


def _moe_layer():
    from training.moe import presets  # noqa: F401 - registers the MoE families
    from training.moe.layer import MOE

    return MOE


def _owners():
    return flag_owners(registry_with([_moe_layer()]))


PARSER_FLAGS = json.loads(RECORD.read_text())["flags"]


def test_every_flag_of_the_parser_has_a_class():
    owners = _owners()
    unclassified = [f for f in PARSER_FLAGS if fc.classify(f, owners) is None]
    assert not unclassified, f"classify these in training/launch/flag_classes.py: {unclassified}"
    assert {fc.classify(f, owners) for f in PARSER_FLAGS} <= set(fc.CLASSES)
    assert "ignored" not in fc.CLASSES


def test_the_table_names_only_flags_of_the_parser_each_once():
    fc.by_flag.cache_clear()
    table = fc.by_flag()           # raises for a flag in two entries
    assert not [f for f in table if f not in PARSER_FLAGS]
    owners = _owners()
    # a flag the registry builds is the registry's: when a toggle takes a flag, its entry here
    # goes (the preset's given defaults are both; the document flags may become DOCUMENT_MASK's)
    assert not [f for f, e in table.items() if f in owners and owners[f].how != "given"
                and e.cls != "documents"]


def test_each_entry_says_why_and_names_what_to_do():
    names = {t.name for t in registry_with([_moe_layer()])}
    for entry in fc.TABLE:
        assert entry.cls in fc.CLASSES and entry.reason and entry.flags
        if entry.cls == "contradicts":
            assert entry.setting in names, entry.reason
        if entry.cls in ("semantic", "backends"):
            assert set(entry.verdicts) == set(fc.BACKENDS), entry.reason


def _refusal(result_or_error, guard):
    """The text of GUARD's refusal ('' if it did not refuse)."""
    if not isinstance(result_or_error, Refusals):
        return ""
    return "\n".join(str(r) for r in result_or_error.refusals if r.guard == guard)


def _try(env, **kw):
    try:
        return launch(env, **kw)
    except Refusals as err:
        return err


def _flags_of(cls, **where):
    """The flags of CLASS whose names do not read as a credential's (those are refused before
    any guard: test_a_flag_named_like_a_secret_is_refused_before_the_guards)."""
    from training.credentials import is_secret

    return [f for e in fc.TABLE if e.cls == cls
            and all(getattr(e, k) == v for k, v in where.items()) for f in e.flags
            if not is_secret(f)]


def test_a_flag_named_like_a_secret_is_refused_before_the_guards(base_env):
    from training.credentials import is_secret
    from training.launch.settings import BadInput

    named = [f for f in fc.by_flag() if is_secret(f)]
    for flag in named:
        assert fc.by_flag()[flag].cls in ("contradicts", "workload", "neutral", "honoured")
        if fc.by_flag()[flag].cls in ("contradicts", "workload"):
            with pytest.raises(BadInput):
                launch(base_env, words=[flag, "x"])


def test_every_contradicting_flag_is_refused_naming_its_setting(base_env):
    flags = _flags_of("contradicts")
    text = _refusal(_try(base_env, words=flags), "flags_against_settings")
    for entry in fc.TABLE:
        if entry.cls != "contradicts":
            continue
        for flag in (f for f in entry.flags if f in flags):
            line = next((ln for ln in text.splitlines() if ln.strip().startswith(flag + ":")),
                        None)
            assert line is not None, f"{flag} was not refused"
            assert f"set {entry.setting} instead" in line


def test_every_workload_flag_is_refused(base_env):
    text = _refusal(_try(base_env, words=_flags_of("workload")), "flags_the_backend_cannot_honour")
    lines = [ln.strip() for ln in text.replace("after the script name, ", "\n").splitlines()]
    for flag in _flags_of("workload"):
        assert any(ln.startswith(f"{flag}: a flag of ") for ln in lines), flag


@pytest.mark.parametrize("backend", ["native", "local", "transformer_engine"])
def test_each_backend_refuses_what_it_cannot_honour_and_passes_the_rest(base_env, backend):
    """A dense model on each backend (Transformer Engine's as on an H200: PLATFORM=h200): a
    flag whose verdict refuses is refused, one honoured is not."""
    dense = [(e, f) for e in fc.TABLE if e.cls in ("semantic", "backends") and not e.experts
             for f in e.flags]
    words = [w for _e, f in dense for w in ([f, "0.1"] if f == "--attention-dropout" else [f])]
    text = _refusal(_try(base_env, TRANSFORMER_IMPL=backend, PLATFORM="h200", words=words),
                    "flags_the_backend_cannot_honour")
    for entry, flag in dense:
        refused = entry.verdicts[backend] is not None
        assert (f"{flag} (" in text or f"{flag} 0.1 (" in text) == refused, flag


def test_the_verdict_function_follows_the_table_for_every_backend():
    for entry in fc.TABLE:
        for backend in fc.BACKENDS:
            if entry.cls in ("semantic", "backends") and entry.check is None:
                assert fc.verdict(entry, backend, [], None) == entry.verdicts[backend]


def test_an_moe_flag_on_a_dense_model_is_refused(base_env):
    flags = [f for e in fc.TABLE if e.experts for f in e.flags]
    assert flags
    text = _refusal(_try(base_env, words=flags), "flags_the_backend_cannot_honour")
    for flag in flags:
        assert f"{flag}:" in text and "has no experts" in text


def test_an_moe_flag_on_an_moe_model_is_honoured_by_the_native_backend(base_env):
    from training.launch.resolve import resolve

    flags = [f for e in fc.TABLE if e.experts and e.verdicts[fc.NATIVE] is None
             for f in e.flags]
    env = dict(base_env, DRY_RUN="1", MODEL_SIZE="tiny", TRANSFORMER_IMPL="native")
    try:
        resolve("qwen3_moe", env, flags, layers=[_moe_layer()])
        text = ""
    except Refusals as err:
        text = _refusal(err, "flags_the_backend_cannot_honour")
    assert not [f for f in flags if f in text]


def test_attention_dropout_on_the_native_flex_attention_is_refused(base_env):
    """gpt-oss's sinks and window run in flex attention, which has no dropout."""
    from training.launch.resolve import resolve
    from training.moe import gpt_oss

    env = dict(base_env, DRY_RUN="1", MODEL_SIZE="tiny", TRANSFORMER_IMPL="native")
    with pytest.raises(Refusals, match=r"--attention-dropout 0.1 .*flex attention"):
        resolve(gpt_oss.FAMILY, env, ["--attention-dropout", "0.1"],
                layers=[_moe_layer(), gpt_oss.GPT_OSS])
    resolve(gpt_oss.FAMILY, env, ["--attention-dropout", "0.0"],
            layers=[_moe_layer(), gpt_oss.GPT_OSS])


def test_document_flags_are_refused_until_document_masking_exists(base_env):
    """They are honoured through DOCUMENT_MASK (the attention side of issue 51); a registry
    without that setting cannot honour them, and says so."""
    has_toggle = any(t.name == "DOCUMENT_MASK" for t in REGISTRY)
    flags = _flags_of("documents")
    result = _try(base_env, words=flags)
    text = _refusal(result, "flags_the_backend_cannot_honour")
    owners = flag_owners(REGISTRY)
    for flag in flags:
        if has_toggle:
            assert flag not in text
        elif fc.classify(flag, owners) == "documents":
            assert f"{flag}:" in text


# -- flags against settings: the class, every flag a setting owns ---------------------------

def _two_values(toggle):
    """Two accepted values of TOGGLE, as typed (None: no two obvious ones)."""
    if toggle.kind == "bool":
        return "1", "0"
    if toggle.kind == "choice":
        return (toggle.choices[0], toggle.choices[1]) if len(toggle.choices) > 1 else None
    if toggle.kind == "int":
        low = int(getattr(toggle.check, "low", None) or 1)
        return str(low + 1), str(low + 2)
    if toggle.kind == "float":
        return "0.25", "0.5"
    from training.launch.toggles import HOST, SPLIT_FORM

    forms = {HOST: ("node0", "node1"), SPLIT_FORM: ("98,2,0", "90,10,0")}
    if toggle.check in forms:
        return forms[toggle.check]
    if toggle.kind in ("path", "str") and not toggle.multi and toggle.check is None:
        return "/tmp/flag-classes-a", "/tmp/flag-classes-b"
    return None


VALUE_FLAGS = sorted((flag, owner.toggle) for flag, owner in flag_owners(REGISTRY).items()
                     if owner.how == "value")


@pytest.mark.parametrize("flag,name", VALUE_FLAGS, ids=[f for f, _ in VALUE_FLAGS])
def test_a_value_flag_against_its_setting_is_refused_naming_it(base_env, flag, name):
    from training.launch.toggles import BY_NAME

    values = _two_values(BY_NAME[name])
    if values is None:
        pytest.skip(f"{name}: no two plain values to compare")
    mine, theirs = values
    text = _refusal(_try(base_env, words=[f"{name}={mine}", flag, theirs]),
                    "flags_against_settings")
    assert f"{flag} {theirs} contradicts {name}={mine}" in text
    same = _refusal(_try(base_env, words=[f"{name}={mine}", flag, mine]), "flags_against_settings")
    assert "contradicts" not in same


ON_OFF = sorted((flag, owner.toggle, owner.how) for flag, owner in flag_owners(REGISTRY).items()
                if owner.how in ("on", "off"))


@pytest.mark.parametrize("flag,name,how", ON_OFF, ids=[f for f, _, _ in ON_OFF])
def test_an_on_off_flag_against_its_setting_is_refused_naming_it(base_env, flag, name, how):
    other = "0" if how == "on" else "1"
    text = _refusal(_try(base_env, words=[f"{name}={other}", flag]), "flags_against_settings")
    assert f"{flag} contradicts {name}={other}" in text


def test_a_flag_that_would_not_reach_megatron_is_refused_with_what_it_needs(base_env):
    text = _refusal(_try(base_env, PLATFORM="h200", words=["--fp8-format", "hybrid"]),
                    "flags_against_settings")
    assert "--fp8-format hybrid sets FP8_FORMAT" in text and "PRECISION=bf16" in text
    assert not _refusal(_try(base_env, PLATFORM="h200", PRECISION="fp8",
                             words=["--fp8-format", "hybrid"]), "flags_against_settings")


@pytest.mark.parametrize("how", ["env", "flag"])
def test_save_into_a_system_folder_is_refused_however_it_is_given(base_env, how):
    words = ["SAVE=/etc/ck"] if how == "env" else ["--save", "/etc/ck"]
    assert "system folder" in _refusal(_try(base_env, words=words), "save_checkpoint")


# -- the native backend's honoured claims, on the CPU ------------------------------------------

def _native_gpt(**config):
    import torch

    from tests.model.parity import gpt_model
    from training.launch.presets import preset_for

    preset = preset_for("llama3", "tiny")
    torch.manual_seed(0)
    model = gpt_model(preset, 1, "native", "torch", torch.float32)
    return model, preset


def _config_of(model):
    return model.decoder.layers[0].config


# The flags the native backend is said to honour, and how that shows in the modules it builds
# (the rest are read by Megatron's own code outside the backend's modules: their entries say).
CPU_CHECKS = {
    "--attention-dropout": "attention_dropout",
    "--hidden-dropout": "hidden_dropout",
}


@pytest.mark.parametrize("flag,field", sorted(CPU_CHECKS.items()))
def test_the_native_backend_reads_the_dropouts(flag, field):
    """The config value reaches the module that applies it, and changes the output in
    training (not in evaluation)."""
    import dataclasses

    import torch

    from megatron.core.models.gpt import GPTModel
    from tests.model.parity import init_single_rank
    from training import specs

    assert fc.by_flag()[flag].verdicts[fc.NATIVE] is None
    init_single_rank("cpu")
    base, preset = _native_gpt()
    config = dataclasses.replace(base.config, **{field: 0.5})
    torch.manual_seed(0)
    model = GPTModel(config=config, transformer_layer_spec=specs.decoder_spec(
                         "native", config, kernels="torch"),
                     vocab_size=preset.vocab_size, max_sequence_length=64,
                     position_embedding_type="rope", rotary_base=preset.rotary_base,
                     share_embeddings_and_output_weights=False)
    layer = model.decoder.layers[0]
    if field == "attention_dropout":
        assert layer.self_attention.core_attention.dropout == 0.5
    else:
        assert layer.hidden_dropout == 0.5
    tokens = torch.randint(0, preset.vocab_size, (1, 16))
    positions = torch.arange(16)[None]
    model.eval()
    with torch.no_grad():
        a = model(tokens, positions, None)
        b = model(tokens, positions, None)
    assert torch.equal(a, b)
    model.train()
    with torch.no_grad():
        c = model(tokens, positions, None)
    assert not torch.allclose(a, c)


def test_the_native_backend_takes_megatrons_init_std():
    import dataclasses

    import torch

    from megatron.core.models.gpt import GPTModel
    from megatron.core.utils import init_method_normal
    from tests.model.parity import init_single_rank
    from training import specs

    init_single_rank("cpu")
    base, preset = _native_gpt()
    config = dataclasses.replace(base.config, init_method_std=0.2,
                                 init_method=init_method_normal(0.2))
    model = GPTModel(config=config, transformer_layer_spec=specs.decoder_spec(
                         "native", config, kernels="torch"),
                     vocab_size=preset.vocab_size, max_sequence_length=64,
                     position_embedding_type="rope", rotary_base=preset.rotary_base,
                     share_embeddings_and_output_weights=False)
    weight = model.decoder.layers[0].self_attention.linear_qkv.weight
    assert 0.15 < float(weight.std()) < 0.25
