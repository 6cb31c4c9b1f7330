"""A batch whose only history is a radix-cache prefix hit (no request continues a chunk)."""

from __future__ import annotations

from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import model_preset
from cpkv_core.traces import load_trace
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy

TRACE = DATA / "prefix_hit.jsonl"


def test_phase_3_refuses_a_batch_whose_only_history_is_a_prefix_hit() -> None:
    batches = load_trace(TRACE, 4).batches
    assert [(r.rid, r.prefix_len, r.prefix_from) for r in batches[1].requests] == [
        ("b", 32, "a"),
        ("c", 0, None),
    ]
    report = verify_levels(
        model_preset("tiny"),
        make_deploy(2, 4),
        batches,
        (3,),
        frozenset(REGISTERED_PHASES),
        Backend.LOCAL,
        debug_checks=True,
        shadow_rate=1.0,
    )
    assert report.ok
    phases = [row.batch_plan.phase for row in report.levels[0].rows]
    assert phases == [3, 2, 3]
    p3 = report.levels[0].rows[1].batch_plan.decisions[2]
    assert [str(r) for r in p3.reasons] == ["HAS_HISTORY rid=b prefix_len=32"]
