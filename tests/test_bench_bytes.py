"""``bytes_by_batch``: the parts of every batch's all-gathered bytes add up to the whole."""

from __future__ import annotations

from cpkv.bench.bytes import bytes_by_batch
from cpkv.bench.measure import ALL_PHASES
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.runner import run_levels
from cpkv_core.config import model_preset
from cpkv_core.planning import KvReadStrategy, KvWriteStrategy, pages_for_trace
from cpkv_core.traces import load_trace
from tests.conftest import DATA, make_deploy


def test_parts_add_up_to_every_gathered_byte_and_direct_writes_gather_nothing() -> None:
    deploy = make_deploy(cp_size=2, page_size=16)
    batches = load_trace(DATA / "long.jsonl", 16).batches
    levels = tuple(range(6))
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    job = RankJob(model_preset("tiny"), deploy, batches, levels, num_pages, ALL_PHASES)
    runs = run_levels(job, Backend.LOCAL)
    rows = bytes_by_batch(runs)
    assert [(r.level, r.batch) for r in rows] == [(lv, b) for lv in levels for b in range(4)]
    for row in rows:
        plan = runs[row.level].steps[row.batch].decision.plan
        tags = runs[row.level].rank_outputs[row.batch][0].gathered_bytes
        assert row.total == sum(tags.values()), (row, tags)
        direct = plan.kv_write is KvWriteStrategy.COMPUTE_OWNER_DIRECT
        # NOTE: batch 2 runs unsplit (SGLang's gate): it writes from its own rows too.
        assert (row.write == 0) == (direct or plan.computes_every_token), row
        reuse_only = direct and plan.kv_read is KvReadStrategy.CURRENT_REUSE
        assert (row.current_gather > 0) == reuse_only, row
        assert (row.materialize > 0) == plan.kv_read.value.startswith("materialized"), row
    assert any(row.phase == 5 for row in rows)
    assert [r.total == 0 for r in rows if r.level < 2] == [False, False, True, False] * 2
