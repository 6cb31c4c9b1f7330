"""A running server's resolved ``ServerArgs`` as cpkv's flags: ``flags.sglang.server_args``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cpkv_core.config import CpMode, DisaggregationMode, TransferBackend
from flags import FlagError, check_flags
from flags.sglang.server_args import read_server_args, server_args_layer


def server(**overrides: Any) -> dict[str, Any]:
    """Resolved fields of a DeepSeek-V3.2 prefill server at cp 8, interleave, page 64."""
    values: dict[str, Any] = {
        "enable_prefill_cp": True,
        "cp_strategy": "interleave",
        "attn_cp_size": 8,
        "page_size": 64,
        "enable_kv_cache_sharding": False,
        "disaggregation_mode": "prefill",
        "disaggregation_transfer_backend": "mooncake",
        "tp_size": 8,
    }
    return values | overrides


@pytest.fixture
def no_cpkv_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    import os

    for name in [n for n in os.environ if n.startswith("CPKV_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "cpkv.toml"
    config.write_text("")
    monkeypatch.setenv("CPKV_CONFIG", str(config))
    return config


def test_reads_the_resolved_fields_with_server_args_provenance() -> None:
    layer = server_args_layer(server())
    assert layer["enable_nsa_prefill_context_parallel"] == (
        True,
        "sglang:ServerArgs.enable_prefill_cp",
    )
    assert layer["nsa_prefill_cp_mode"] == (
        CpMode.ROUND_ROBIN_SPLIT,
        "sglang:ServerArgs.cp_strategy",
    )
    assert layer["attn_cp_size"][0] == 8 and layer["page_size"][0] == 64
    assert layer["disaggregation_mode"][0] is DisaggregationMode.PREFILL
    assert layer["disaggregation_transfer_backend"][0] is TransferBackend.MOONCAKE
    assert layer["enable_nsa_prefill_cp_shared_kv"] == (
        False,
        "sglang:ServerArgs.enable_kv_cache_sharding",
    )


def test_kv_sharding_is_phase_2_only_over_prefill_cp_ranks() -> None:
    assert server_args_layer(server(enable_kv_cache_sharding=True))[
        "enable_nsa_prefill_cp_shared_kv"
    ][0]
    plain_tp = server(enable_prefill_cp=False, enable_kv_cache_sharding=True)
    assert "enable_nsa_prefill_cp_shared_kv" not in server_args_layer(plain_tp)
    assert "nsa_prefill_cp_mode" not in server_args_layer(plain_tp), "no strategy while CP is off"


def test_an_unset_field_leaves_the_flag_to_cpkvs_sources() -> None:
    assert "page_size" not in server_args_layer(server(page_size=None))
    assert "page_size" not in server_args_layer({"enable_prefill_cp": False})


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("cp_strategy", "ring", "ServerArgs.cp_strategy must be one of zigzag, interleave"),
        (
            "disaggregation_transfer_backend",
            "carrier-pigeon",
            "ServerArgs.disaggregation_transfer_backend",
        ),
    ],
)
def test_refuses_a_value_cpkv_cannot_take_naming_the_field(
    field: str, value: str, says: str
) -> None:
    with pytest.raises(FlagError, match=says):
        server_args_layer(server(**{field: value}))


def test_the_server_goes_over_config_and_environment_with_a_note(
    no_cpkv_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_cpkv_env.write_text("attn-cp-size = 4\nenable-nsa-prefill-cp-narrow-output = true\n")
    monkeypatch.setenv("CPKV_SHADOW_RATE", "0.25")
    resolved = read_server_args(server())
    flags = resolved.flags
    assert (flags.attn_cp_size, flags.enable_nsa_prefill_cp_narrow_output) == (8, True)
    assert flags.shadow_rate == 0.25
    assert resolved.sources["attn_cp_size"] == "sglang:ServerArgs.attn_cp_size"
    assert resolved.sources["enable_nsa_prefill_cp_narrow_output"] == f"config:{no_cpkv_env}"
    assert resolved.sources["shadow_rate"] == "env:CPKV_SHADOW_RATE"
    assert resolved.notes == (
        f"attn_cp_size = 4 from config:{no_cpkv_env} is replaced by the server's "
        "ServerArgs.attn_cp_size = 8",
    )
    assert check_flags(flags) == []


def test_the_start_up_rules_of_cpkv_flags_apply(
    no_cpkv_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT", "1")
    codes = [
        str(p.code) for p in check_flags(read_server_args(server(enable_prefill_cp=False)).flags)
    ]
    assert codes == ["PHASE_WITHOUT_CP"]
