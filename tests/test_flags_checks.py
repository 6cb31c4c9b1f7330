"""Start-up checks of flag combinations, the enabled set and the deployment."""

from __future__ import annotations

from typing import Any

import pytest

import flags.checks
from cpkv_core.config import (
    CpMode,
    DeploymentConfig,
    DisaggregationMode,
    TransferBackend,
)
from flags import FlagError, FlagSet, ProblemCode, check_flags, debug_benchmark_warning
from phases import PhaseId
from phases.reasons import Reason, ReasonCode


def make_flags(phases: tuple[int, ...] = (), cp: bool = True, **overrides: Any) -> FlagSet:
    """CP on with 4 ranks and the given phase flags; ``overrides`` set any other field."""
    fields = {
        1: "enable_nsa_prefill_cp_narrow_output",
        2: "enable_nsa_prefill_cp_shared_kv",
        3: "enable_nsa_prefill_cp_current_reuse",
        4: "enable_nsa_prefill_cp_page_aligned_split",
        5: "enable_nsa_prefill_cp_compute_owner_write",
    }
    values: dict[str, Any] = {"enable_nsa_prefill_context_parallel": cp, "attn_cp_size": 4}
    values |= {fields[p]: True for p in phases}
    return FlagSet(**(values | overrides))


def texts(flag_set: FlagSet) -> list[str]:
    return [str(p) for p in check_flags(flag_set)]


def test_defaults_have_no_problems() -> None:
    assert check_flags(FlagSet()) == []


def test_all_phases_in_seq_split_no_pd_have_no_problems() -> None:
    assert texts(make_flags((1, 2, 3, 4, 5))) == []


def test_allows_page_aligned_split_and_direct_write_with_round_robin() -> None:
    """Round-robin (SGLang's interleave) has a page-aligned split: the page interleave."""
    assert texts(make_flags((2, 4, 5), nsa_prefill_cp_mode=CpMode.ROUND_ROBIN_SPLIT)) == []


def test_allows_shared_kv_with_cp_decode_side() -> None:
    """PD re-shards owned pages from cp N to the decode ranks that own them (docs/pd.md)."""
    assert texts(make_flags((2,), disaggregation_decode_cp_size=2)) == []
    pd = {"disaggregation_mode": DisaggregationMode.PREFILL, "disaggregation_decode_cp_size": 4}
    assert texts(make_flags((2, 3, 4, 5), **pd)) == []


def test_rejects_shared_kv_with_non_mooncake_backend_under_pd() -> None:
    found = texts(
        make_flags(
            (2,),
            disaggregation_mode=DisaggregationMode.PREFILL,
            disaggregation_transfer_backend=TransferBackend.NIXL,
        )
    )
    assert found == [
        "STARTUP_CONTRACT phase=2 disaggregation_transfer_backend=nixl needs Mooncake "
        "(owned-page transfer with logical positions) or no PD"
    ]


def test_allows_any_backend_without_pd() -> None:
    assert texts(make_flags((2,), disaggregation_transfer_backend=TransferBackend.NIXL)) == []


@pytest.mark.parametrize(
    ("phases", "missing"),
    [((3,), [(3, 2)]), ((4,), [(4, 2)]), ((2, 5), [(5, 4)]), ((3, 5), [(3, 2), (5, 4)])],
)
def test_reports_each_phase_on_without_its_needs(
    phases: tuple[int, ...], missing: list[tuple[int, int]]
) -> None:
    expected = [f"NEEDS_DISABLED phase={p} needs={n}" for p, n in missing]
    assert texts(make_flags(phases)) == expected


def test_narrow_output_needs_nothing() -> None:
    assert texts(make_flags((1,))) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"attn_cp_size": 0}, "CP_SIZE_BELOW_ONE attn_cp_size=0"),
        ({"page_size": 0}, "PAGE_SIZE_BELOW_ONE page_size=0"),
        ({"disaggregation_decode_cp_size": 0}, "DECODE_CP_SIZE_BELOW_ONE"),
        ({"max_phase": 6}, "MAX_PHASE_OUT_OF_RANGE CPKV_MAX_PHASE=6"),
        ({"max_phase": -1}, "MAX_PHASE_OUT_OF_RANGE CPKV_MAX_PHASE=-1"),
        (
            {"nsa_prefill_cp_min_tokens": -1},
            "CP_MIN_TOKENS_BELOW_ZERO nsa_prefill_cp_min_tokens=-1",
        ),
    ],
)
def test_reports_values_out_of_range(overrides: dict[str, Any], expected: str) -> None:
    assert [t for t in texts(make_flags(**overrides)) if t.startswith(expected)] != []


@pytest.mark.parametrize("ceiling", [0, 5])
def test_allows_ceiling_at_the_ends_of_its_range(ceiling: int) -> None:
    assert texts(make_flags((1, 2), max_phase=ceiling)) == []


def test_reports_each_phase_flag_on_while_cp_is_off() -> None:
    found = texts(make_flags((1, 2), cp=False))
    assert found == ["PHASE_WITHOUT_CP phase=1", "PHASE_WITHOUT_CP phase=2"]


def test_collects_every_problem_at_once() -> None:
    flag_set = make_flags(
        (3, 4, 5),
        cp=False,
        attn_cp_size=0,
        page_size=0,
        max_phase=9,
        nsa_prefill_cp_mode=CpMode.ROUND_ROBIN_SPLIT,
    )
    codes = [p.code for p in check_flags(flag_set)]
    assert codes == [
        ProblemCode.CP_SIZE_BELOW_ONE,
        ProblemCode.PAGE_SIZE_BELOW_ONE,
        ProblemCode.MAX_PHASE_OUT_OF_RANGE,
        ProblemCode.PHASE_WITHOUT_CP,
        ProblemCode.PHASE_WITHOUT_CP,
        ProblemCode.PHASE_WITHOUT_CP,
        ProblemCode.NEEDS_DISABLED,
        ProblemCode.NEEDS_DISABLED,
    ]  # NOTE: phase contracts need valid sizes first; the test below covers them.


def test_every_problem_carries_a_hint_and_json() -> None:
    for problem in check_flags(make_flags((3,), cp=False, page_size=0)):
        doc = problem.to_json()
        assert problem.hint and doc["text"] == str(problem) and doc["code"] == problem.code


def test_merges_phase_startup_contract_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[frozenset[PhaseId], DeploymentConfig]] = []

    def fake(enabled: frozenset[PhaseId], deploy: DeploymentConfig) -> dict[PhaseId, list[Reason]]:
        seen.append((enabled, deploy))
        rule = "needs a power of two"
        return {PhaseId.SHARDED_KV: [Reason(ReasonCode.STARTUP_CONTRACT, (("cp_size", 4),), rule)]}

    monkeypatch.setattr(flags.checks, "startup_problems", fake)
    found = check_flags(make_flags((2,)))
    assert [str(p) for p in found] == [
        "STARTUP_CONTRACT phase=2 attn_cp_size=4 needs a power of two"
    ]
    assert found[0].hint == ("phase 2 needs a power of two: change --attn-cp-size, or turn it off")
    assert seen == [(frozenset({PhaseId.SHARDED_KV}), make_flags((2,)).deployment())]


def test_skips_phase_contracts_when_sizes_are_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: object) -> dict[PhaseId, list[str]]:
        raise AssertionError("contracts need a valid deployment")

    monkeypatch.setattr(flags.checks, "startup_problems", fail)
    assert texts(make_flags((1,), attn_cp_size=0)) == ["CP_SIZE_BELOW_ONE attn_cp_size=0"]


def test_enabled_phases_are_the_flagged_ones_while_cp_is_on() -> None:
    assert make_flags((1, 2, 3)).enabled_phases() == {1, 2, 3}


def test_enabled_phases_are_empty_while_cp_is_off() -> None:
    flag_set = make_flags((1, 2), cp=False)
    assert flag_set.enabled_phases() == frozenset()
    assert flag_set.flagged_phases() == {PhaseId.NARROW_OUTPUT, PhaseId.SHARDED_KV}


def test_ceiling_is_left_to_the_gate() -> None:
    flag_set = make_flags((1, 2, 4), max_phase=1)
    assert flag_set.enabled_phases() == {1, 2, 4} and flag_set.max_phase == 1


def test_deployment_uses_cp_size_only_while_cp_is_on() -> None:
    on = make_flags(
        nsa_prefill_cp_mode=CpMode.ROUND_ROBIN_SPLIT,
        page_size=16,
        disaggregation_mode=DisaggregationMode.PREFILL,
        disaggregation_transfer_backend=TransferBackend.NIXL,
        disaggregation_decode_cp_size=2,
    )
    assert on.deployment() == DeploymentConfig(
        cp_size=4,
        cp_mode=CpMode.ROUND_ROBIN_SPLIT,
        page_size=16,
        disaggregation_mode=DisaggregationMode.PREFILL,
        transfer_backend=TransferBackend.NIXL,
        decode_cp_size=2,
    )
    assert make_flags(cp=False).deployment().cp_size == 1


def test_deployment_refuses_sizes_below_one() -> None:
    with pytest.raises(FlagError, match=r"page_size must be >= 1, got 0 \(flag --page-size\)"):
        make_flags(page_size=0).deployment()


def test_debug_checks_warn_during_benchmarks_only_when_on() -> None:
    assert debug_benchmark_warning(FlagSet()) is None
    warning = debug_benchmark_warning(FlagSet(debug_cp_shared_kv=True))
    assert warning is not None and "SGLANG_DEBUG_CP_SHARED_KV" in warning
    assert "synchronise" in warning


def test_flag_set_is_frozen_and_forbids_unknown_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        FlagSet(cp_size=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="frozen"):
        FlagSet().page_size = 4  # type: ignore[misc]


def test_deployment_carries_the_cp_minimum_and_refuses_a_negative_one() -> None:
    assert make_flags(nsa_prefill_cp_min_tokens=4096).deployment().cp_min_tokens == 4096
    with pytest.raises(FlagError, match=r"cp_min_tokens must be >= 0, got -1 \(flag --nsa-pre"):
        make_flags(nsa_prefill_cp_min_tokens=-1).deployment()


@pytest.mark.parametrize(
    ("backend", "refused"),
    [(TransferBackend.MOONCAKE_TCP, False), (TransferBackend.MORI, True)],
)
def test_phase_2_runs_over_mooncake_tcp_but_not_mori(
    backend: TransferBackend, refused: bool
) -> None:
    flag_set = make_flags(
        (2,),
        disaggregation_mode=DisaggregationMode.PREFILL,
        disaggregation_transfer_backend=backend,
    )
    codes = [p.code for p in check_flags(flag_set)]
    assert (ProblemCode.STARTUP_CONTRACT in codes) is refused, codes
    assert flag_set.deployment().pd_backend in (TransferBackend.MOONCAKE, TransferBackend.MORI)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("shadow_rate", 0.0, None),
        ("shadow_rate", 1.0, None),  # every batch shadowed: the edge is in
        ("shadow_rate", 1.01, ProblemCode.SHADOW_RATE_OUT_OF_RANGE),
        ("shadow_rate", -0.01, ProblemCode.SHADOW_RATE_OUT_OF_RANGE),
        ("batch_timeout_s", 0.0, ProblemCode.BATCH_TIMEOUT_OUT_OF_RANGE),  # no wait at all
        ("batch_timeout_s", 0.001, None),
        ("batch_timeout_s", flags.checks.MAX_BATCH_TIMEOUT_S, None),
        (
            "batch_timeout_s",
            flags.checks.MAX_BATCH_TIMEOUT_S * 1.01,
            ProblemCode.BATCH_TIMEOUT_OUT_OF_RANGE,
        ),
    ],
)
def test_the_ranges_of_the_shadow_rate_and_the_batch_timeout_hold_at_their_edges(
    field: str, value: float, code: ProblemCode | None
) -> None:
    codes = [p.code for p in check_flags(FlagSet(**{field: value}))]
    assert codes == ([] if code is None else [code])
