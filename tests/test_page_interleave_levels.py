"""Phases 4 and 5 under round-robin on in-process ranks: the page interleave and its direct
write are bitwise equal to the reference, chunks resuming mid-page and prefix hits included,
with gather and peer-read views and with the debug checks on."""

from __future__ import annotations

import pytest

from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, MaterializeMode, SplitGate, model_preset
from cpkv_core.planning import SplitStrategy
from phases import PhaseId
from tests.conftest import interleave_trace

TINY = model_preset("tiny")
ALL = frozenset(PhaseId)


# NOTE: every cp 1-5 and page 1/2/4/16/64, not their product: tokens grow with cp * page.
GRID = [
    (1, 2, 2, MaterializeMode.GATHER, False),
    (2, 16, 2, MaterializeMode.GATHER, False),
    (2, 64, 2, MaterializeMode.GATHER, False),
    (3, 4, 3, MaterializeMode.GATHER, True),
    (4, 2, 3, MaterializeMode.PEER_READ, False),
    (5, 1, 3, MaterializeMode.GATHER, False),
    (5, 4, 3, MaterializeMode.PEER_READ, True),
    (5, 2, 4, MaterializeMode.GATHER, False),
]


@pytest.mark.parametrize(("cp_size", "page_size", "pages_per_rank", "materialize", "debug"), GRID)
def test_levels_4_and_5_match_the_reference_bitwise_under_round_robin(
    cp_size: int, page_size: int, pages_per_rank: int, materialize: MaterializeMode, debug: bool
) -> None:
    deploy = DeploymentConfig(
        cp_size=cp_size,
        page_size=page_size,
        cp_mode=CpMode.ROUND_ROBIN_SPLIT,
        materialize=materialize,
        # NOTE: batch 2's 3 tokens are below SGLang's interleave minimum (cp) at cp 4 and 5:
        # the test is about the split's own fallback, so every batch is split.
        split_gate=SplitGate.SPLIT_ANYWAY,
    )
    batches = interleave_trace(cp_size, page_size, pages_per_rank)
    report = verify_levels(TINY, deploy, batches, (4, 5), ALL, Backend.LOCAL, debug_checks=debug)
    for level in report.levels:
        for row in level.rows:
            assert row.comparison.topk_equal and row.comparison.max_abs_diff == 0.0, row
    level4, level5 = report.levels
    # Batch 1: a resumes mid-page (page > 1), c hits b's prefix; both phases take it.
    assert level4.rows[1].batch_plan.plan.split is SplitStrategy.PAGE_INTERLEAVED
    direct = level5.rows[1]
    assert direct.batch_plan.phase == 5
    if materialize is MaterializeMode.GATHER:
        # NOTE: peer-read's key buffer is [history view ; gathered current rows]: the read,
        # not the write, gathers the chunk there.
        assert direct.gathered_bytes_by_tag.get("current_kv", 0) == 0
    reasons = [str(r) for r in level5.rows[2].batch_plan.decisions[3].reasons]
    if cp_size > 1:
        assert level5.rows[2].batch_plan.plan.split is SplitStrategy.ROUND_ROBIN
        assert reasons and reasons[0].startswith("UNBALANCED pages="), reasons
