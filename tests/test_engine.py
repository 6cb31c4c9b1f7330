"""CP phase 0 against the non-CP reference: every batch, every layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch

from cpkv.run.jobs import Backend
from cpkv.run.verify import VerifyReport, verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, IndexKDtype, SplitGate, model_preset
from cpkv_core.planning import BatchSpec, Scheduler
from cpkv_core.runtime import ReferenceModel
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.device_plan import BatchTensors, expand
from cpkv_core.traces import load_trace, parse_trace_text
from phases import PhaseId, levels_of
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy, mixed_trace

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)


def verify(
    deploy: DeploymentConfig,
    batches: tuple[BatchSpec, ...],
    levels: Sequence[int] = (0,),
    enabled: frozenset[PhaseId] = ALL,
) -> VerifyReport:
    return verify_levels(TINY, deploy, batches, levels, enabled, Backend.LOCAL)


def assert_every_level_matches(report: VerifyReport, num_batches: int) -> None:
    for level in report.levels:
        rows = level.rows
        assert [r.comparison.topk_mismatches for r in rows] == [0] * num_batches, level.level
        assert [r.comparison.max_abs_diff for r in rows] == [0.0] * num_batches, level.level
    assert report.ok


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
def test_long_requests_take_phase_5_and_match_reference_bitwise(
    cp_size: int, page_size: int
) -> None:
    deploy = make_deploy(cp_size, page_size)
    batches = load_trace(DATA / "long.jsonl", page_size).batches
    report = verify(deploy, batches, levels_of(ALL))
    assert_every_level_matches(report, len(batches))
    top = report.levels[-1]
    assert 5 in [row.batch_plan.phase for row in top.rows]
    # NOTE: SGLang's gate (the default) runs batch 2 (requests of 3 and 2 tokens) unsplit.
    assert [row.batch_plan.cp_off is not None for row in top.rows] == [
        False,
        False,
        cp_size > 1,
        False,
    ]
    for row, batch in zip(top.rows, batches, strict=True):
        if row.batch_plan.phase == 5 and batch.has_history:
            # Direct writes need no all-gather: a history batch gathers no current KV at all.
            assert row.gathered_bytes_by_tag.get("current_kv", 0) == 0


@pytest.mark.parametrize("cp_mode", list(CpMode))
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
def test_levels_0_to_3_match_reference_bitwise(
    cp_size: int, page_size: int, cp_mode: CpMode
) -> None:
    # NOTE: the split itself (short requests, ranks left empty) is under test, so every batch
    # is split; under SGLang's gate most of this trace's batches would run unsplit.
    deploy = make_deploy(cp_size, page_size, cp_mode, split_gate=SplitGate.SPLIT_ANYWAY)
    batches = mixed_trace(page_size).batches
    # NOTE: phases 4 and 5 fall back on every batch of this trace (each has a short
    # request); the long-request grid above covers levels 4 and 5.
    report = verify(deploy, batches, range(4))
    assert_every_level_matches(report, len(batches))


def test_phase0_matches_reference_with_fp32_index_keys() -> None:
    deploy = make_deploy(3, 4, CpMode.ROUND_ROBIN_SPLIT, IndexKDtype.FP32)
    batches = mixed_trace(4).batches
    report = verify(deploy, batches)
    assert report.ok
    assert report.levels[0].max_abs_diff == 0.0


def test_topk_is_selective_on_long_requests() -> None:
    """The indexer really chooses: a query with more causal keys than index_topk drops some."""
    deploy = make_deploy(2, 4)
    text = '{"batch": 0, "requests": [{"rid": "a", "prefix_len": 0, "extend_len": 64}]}'
    batches = parse_trace_text(text, 4).batches
    assert verify(deploy, batches).ok
    scheduled = Scheduler(32, 4).schedule(batches[0])
    topk = ReferenceModel(TINY, 32, 4).run_batch(scheduled).requests[0].topk  # [layers, 64, k]
    last = topk[0, -1]
    assert (last >= 0).all() and last.tolist() != list(range(TINY.index_topk))
    assert torch.equal(topk[0, 0], torch.tensor([0] + [-1] * (TINY.index_topk - 1)))


def test_verify_detects_a_stale_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Key rows shifted by one (each position reads its neighbour's key) must fail."""

    def shifted_keys(*args, **kwargs) -> BatchTensors:  # type: ignore[no-untyped-def]
        tensors = expand(*args, **kwargs)
        return dataclasses.replace(tensors, key_rows=tensors.key_rows.roll(1))

    monkeypatch.setattr(engine_mod, "expand", shifted_keys)
    deploy = make_deploy(2, 4)
    batches = mixed_trace(4).batches
    report = verify(deploy, batches)
    assert not report.ok
    assert report.levels[0].max_abs_diff > 0.0


def test_gathered_bytes_count_current_kv_and_tail_exactly() -> None:
    deploy = make_deploy(4, 4, split_gate=SplitGate.SPLIT_ANYWAY)  # NOTE: batch 0 is split
    batches = mixed_trace(4).batches
    report = verify(deploy, batches)
    first = report.levels[0].rows[0]
    # Batch 0: a=37, b=3, c=1 tokens; zigzag over 8 blocks gives ranks 6/6/... tokens.
    from cpkv_core.planning.split import build_zigzag_split

    max_local = build_zigzag_split((37, 3, 1), 4).max_local
    per_token = TINY.kv_dim * 4 + TINY.index_head_dim * 1 + 4  # latent fp32, fp8 k, fp32 scale
    expected = 4 * max_local * (per_token * TINY.num_layers + TINY.hidden_size * 4)
    assert first.gathered_bytes_by_rank == (expected,) * 4
