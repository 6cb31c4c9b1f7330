"""Phase 1: narrow output equals the full gather's last-token rows, and moves exactly
``cp_size x bs x hidden`` at the tail."""

from __future__ import annotations

import pytest

from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import CpMode, SplitGate, model_preset
from cpkv_core.planning.execution import ExecutionPlan, OutputStrategy
from cpkv_core.planning.sglang_cp import gather_rows_per_rank
from cpkv_core.planning.split import build_split
from cpkv_core.traces.trace import load_trace
from phases.ids import PhaseId
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
NARROW = frozenset({PhaseId.NARROW_OUTPUT})


@pytest.mark.parametrize("cp_mode", list(CpMode))
@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
def test_narrow_output_matches_reference_and_counts_tail_bytes(
    cp_size: int, cp_mode: CpMode
) -> None:
    deploy = make_deploy(cp_size, 4, cp_mode, split_gate=SplitGate.SPLIT_ANYWAY)
    batches = load_trace(DATA / "narrow.jsonl", 4).batches
    report = verify_levels(TINY, deploy, batches, (0, 1), NARROW, Backend.LOCAL)
    assert report.ok
    assert report.levels[1].max_abs_diff == 0.0
    for row, batch in zip(report.levels[1].rows, batches, strict=True):
        hidden_bytes = TINY.hidden_size * 4
        if row.batch_plan.phase == 1:
            assert row.batch_plan.plan.output is OutputStrategy.NARROW_LAST_TOKEN
            expected = cp_size * len(batch.requests) * hidden_bytes
        else:
            max_local = build_split(batch.extend_lens, cp_size, cp_mode).max_local
            split = ExecutionPlan.baseline(cp_mode).split
            expected = cp_size * gather_rows_per_rank(max_local, split, cp_size) * hidden_bytes
        assert row.gathered_bytes_by_tag["tail_hidden"] == expected
    # Batch 1 speculates, batch 2 asks for logprobs and hidden states: both keep the full gather.
    assert [row.batch_plan.phase for row in report.levels[1].rows] == [1, 0, 0, 1]
