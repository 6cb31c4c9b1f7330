"""Flag sources: defaults < config file < environment < command line, with provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpkv_core.config import CpMode, DisaggregationMode, TransferBackend
from flags import (
    FLAG_SPECS,
    PHASE_FLAGS,
    FlagError,
    FlagSet,
    locate_config,
    parse_config_text,
    parse_set_option,
    resolve_flags,
)
from phases import PhaseId


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No flag variables from the caller's environment; ./cpkv.toml is looked up in tmp."""
    for spec in FLAG_SPECS.values():
        monkeypatch.delenv(spec.env, raising=False)
    monkeypatch.delenv("CPKV_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults_come_from_the_flag_set_with_default_provenance() -> None:
    resolved = resolve_flags()
    assert resolved.flags == FlagSet()
    assert set(resolved.sources.values()) == {"default"}
    assert resolved.config_found is False
    assert resolved.flags.page_size == 64 and resolved.flags.attn_cp_size == 1
    assert resolved.flags.nsa_prefill_cp_mode is CpMode.IN_SEQ_SPLIT
    assert resolved.flags.disaggregation_transfer_backend is TransferBackend.MOONCAKE


def test_file_beats_default_env_beats_file_cli_beats_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path / "flags.toml",
        "attn-cp-size = 2\npage-size = 16\nnsa-prefill-cp-mode = 'round-robin-split'\n"
        "enable-nsa-prefill-context-parallel = true\n",
    )
    monkeypatch.setenv("CPKV_PAGE_SIZE", "32")
    monkeypatch.setenv("CPKV_ATTN_CP_SIZE", "4")
    resolved = resolve_flags(config, {"attn_cp_size": 8})
    flags, sources = resolved.flags, resolved.sources
    assert (flags.attn_cp_size, sources["attn_cp_size"]) == (8, "cli")
    assert (flags.page_size, sources["page_size"]) == (32, "env:CPKV_PAGE_SIZE")
    assert flags.nsa_prefill_cp_mode is CpMode.ROUND_ROBIN_SPLIT
    assert sources["nsa_prefill_cp_mode"] == f"config:{config}"
    assert sources["enable_nsa_prefill_cp_shared_kv"] == "default"


def test_config_comes_from_cpkv_config_env_when_no_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path / "elsewhere.toml", "page-size = 4\n")
    write(tmp_path / "cpkv.toml", "page-size = 8\n")
    monkeypatch.setenv("CPKV_CONFIG", str(config))
    assert locate_config().origin == "$CPKV_CONFIG"
    assert resolve_flags().flags.page_size == 4


def test_config_defaults_to_cpkv_toml_in_the_working_directory(tmp_path: Path) -> None:
    write(tmp_path / "cpkv.toml", "page-size = 8\n")
    resolved = resolve_flags()
    assert resolved.flags.page_size == 8 and resolved.config_found
    assert resolved.sources["page_size"] == "config:cpkv.toml"


def test_explicit_config_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FlagError, match=r"missing\.toml \(from --config\) does not exist"):
        resolve_flags(tmp_path / "missing.toml")


def test_env_only_knobs_read_from_sglang_and_cpkv_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_DEBUG_CP_SHARED_KV", "1")
    monkeypatch.setenv("CPKV_MAX_PHASE", "3")
    resolved = resolve_flags()
    assert resolved.flags.debug_cp_shared_kv is True and resolved.flags.max_phase == 3
    assert resolved.sources["debug_cp_shared_kv"] == "env:SGLANG_DEBUG_CP_SHARED_KV"
    assert resolved.sources["max_phase"] == "env:CPKV_MAX_PHASE"


def test_empty_max_phase_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPKV_MAX_PHASE", "")
    resolved = resolve_flags()
    assert resolved.flags.max_phase is None and resolved.sources["max_phase"] == "default"


def test_malformed_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPKV_ENABLE_NSA_PREFILL_CP_SHARED_KV", "maybe")
    with pytest.raises(FlagError, match=r"CPKV_ENABLE_NSA_PREFILL_CP_SHARED_KV='maybe'"):
        resolve_flags()


def test_every_server_flag_has_a_cpkv_env_var_and_a_dash_toml_key() -> None:
    for name, spec in FLAG_SPECS.items():
        assert spec.help, f"{name} has no help"
        if spec.env_only:
            assert spec.toml_key is None
            continue
        assert spec.env == "CPKV_" + name.upper()
        assert spec.toml_key == name.replace("_", "-") and spec.cli == f"--{spec.toml_key}"
    assert PHASE_FLAGS[PhaseId.SHARDED_KV] == "--enable-nsa-prefill-cp-shared-kv"


def test_config_round_trips_every_server_flag(tmp_path: Path) -> None:
    flags = FlagSet(
        enable_nsa_prefill_context_parallel=True,
        nsa_prefill_cp_mode=CpMode.ROUND_ROBIN_SPLIT,
        attn_cp_size=8,
        page_size=16,
        enable_nsa_prefill_cp_shared_kv=True,
        disaggregation_mode=DisaggregationMode.PREFILL,
        disaggregation_transfer_backend=TransferBackend.NIXL,
        disaggregation_decode_cp_size=2,
    )
    lines = []
    for name, spec in FLAG_SPECS.items():
        if spec.toml_key is None:
            continue
        value = getattr(flags, name)
        shown = str(value).lower() if isinstance(value, bool | int | float) else f'"{value}"'
        lines.append(f"{spec.toml_key} = {shown}")
    config = write(tmp_path / "all.toml", "\n".join(lines) + "\n")
    resolved = resolve_flags(config)
    assert resolved.flags == flags
    assert {s for n, s in resolved.sources.items() if not FLAG_SPECS[n].env_only} == {
        f"config:{config}"
    }


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("page-size = ", r"bad\.toml: not valid TOML"),
        ("page-sise = 4", r"bad\.toml: unknown key 'page-sise'; did you mean 'page-size'"),
        ("page_size = 4", r"unknown key 'page_size'; write it as 'page-size'"),
        ("max-phase = 3", r"unknown key 'max-phase'; it is environment-only: set CPKV_MAX_PHASE"),
        ("page-size = '4'", r"bad\.toml: key 'page-size' must be an integer, got '4'"),
        ("attn-cp-size = true", r"key 'attn-cp-size' must be an integer, got True"),
        ("enable-nsa-prefill-cp-shared-kv = 1", r"'enable-nsa-prefill-cp-shared-kv' must be true"),
        ("nsa-prefill-cp-mode = 'zigzag'", r"'nsa-prefill-cp-mode' must be one of 'in-seq"),
        ("[server]\npage-size = 4", r"unknown key 'server'"),
    ],
)
def test_malformed_config_names_the_file_and_key(text: str, match: str) -> None:
    with pytest.raises(FlagError, match=match):
        parse_config_text(text, Path("bad.toml"))


def test_cli_values_parse_strings_by_flag_type() -> None:
    items = ["attn-cp-size=8", "--enable-nsa-prefill-cp-shared-kv=1"]
    cli = dict(parse_set_option(s) for s in items)
    resolved = resolve_flags(None, cli)
    assert resolved.flags.attn_cp_size == 8 and resolved.flags.enable_nsa_prefill_cp_shared_kv
    assert resolved.sources["attn_cp_size"] == "cli"


@pytest.mark.parametrize(
    ("cli", "match"),
    [
        ({"attn-cp-size": "eight"}, r"--attn-cp-size: .*integer.*got 'eight'"),
        ({"max_phase": 2}, r"max_phase is environment-only: set CPKV_MAX_PHASE"),
        ({"cp-size": 2}, r"unknown flag 'cp-size'"),
    ],
)
def test_rejects_bad_cli_values(cli: dict[str, object], match: str) -> None:
    with pytest.raises(FlagError, match=match):
        resolve_flags(None, cli)


def test_set_option_needs_key_and_value() -> None:
    with pytest.raises(FlagError, match="KEY=VALUE"):
        parse_set_option("attn-cp-size")


def test_cp_minimum_comes_from_the_environment_as_a_typed_int(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CPKV_NSA_PREFILL_CP_MIN_TOKENS", "4096")
    resolved = resolve_flags()
    assert resolved.flags.nsa_prefill_cp_min_tokens == 4096
    assert resolved.sources["nsa_prefill_cp_min_tokens"] == "env:CPKV_NSA_PREFILL_CP_MIN_TOKENS"
    assert FLAG_SPECS["nsa_prefill_cp_min_tokens"].toml_key == "nsa-prefill-cp-min-tokens"
