"""``bytes_by_batch``: the parts of every batch's all-gathered bytes add up to the whole; the
count-only figures' model counts what the bench's model counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cpkv.bench.byte_model import one_head
from cpkv.bench.bytes import bytes_by_batch
from cpkv.bench.cp_off import cp_off_bytes_jobs, cp_off_bytes_rows
from cpkv.bench.kv import page_balance
from cpkv.bench.measure import ALL_PHASES
from cpkv.run.jobs import Backend, LevelRun, RankJob
from cpkv.run.runner import run_levels
from cpkv_core.config import CpMode, model_preset
from cpkv_core.planning import KvReadStrategy, KvWriteStrategy, pages_for_trace
from cpkv_core.runtime.kv_pool import kv_bytes_per_page
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


def _counts(runs: list[LevelRun]) -> list[object]:
    """Every count a run holds, by level, batch and rank: what the plan decided, each
    rank's gathered bytes by purpose and its KV bytes."""
    return [
        (
            run.level,
            step.decision.phase,
            str(step.decision.plan),
            [(out.gathered_bytes, out.kv_bytes) for out in outputs],
        )
        for run in runs
        for step, outputs in zip(run.steps, run.rank_outputs, strict=True)
    ]


@pytest.mark.parametrize(
    ("mode", "cp_size"), [(CpMode.IN_SEQ_SPLIT, 2), (CpMode.ROUND_ROBIN_SPLIT, 4)]
)
def test_the_one_head_model_counts_every_byte_the_model_counts(mode: CpMode, cp_size: int) -> None:
    """The count-only figures run on ``one_head`` (``byte_model``): its heads change no
    decision, gathered byte or stored byte at any level (their top-k do change)."""
    deploy = make_deploy(cp_size=cp_size, page_size=16).model_copy(update={"cp_mode": mode})
    batches = load_trace(DATA / "long.jsonl", 16).batches
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    model = model_preset("tiny")
    runs = {
        m.name: run_levels(
            RankJob(m, deploy, batches, tuple(range(6)), num_pages, ALL_PHASES), Backend.LOCAL
        )
        for m in (model, one_head(model))
    }
    counted, one = runs[model.name], runs[one_head(model).name]
    assert _counts(one) == _counts(counted)
    assert any(sum(out.gathered_bytes.values()) for out in one[-1].rank_outputs[-1])
    # NOTE: the heads do change what is computed: the check above compares counts alone.
    assert not all(
        torch.equal(a[0].topk, b[0].topk)
        for ra, rb in zip(counted, one, strict=True)
        for a, b in zip(ra.rank_outputs, rb.rank_outputs, strict=True)
    )


def test_cp_off_bytes_stop_after_the_last_batch_below_the_minimum_and_count_the_same() -> None:
    """The bytes half runs the trace up to its last batch below the minimum: every count of
    those batches, and so every row, is what the whole trace's run gives them."""
    deploy = make_deploy(cp_size=2, page_size=16)
    batches = load_trace(DATA / "long.jsonl", 16).batches  # 280, 275, 5, 297 tokens
    cut = cp_off_bytes_jobs(model_preset("tiny"), deploy, batches, 280, levels=(2, 5))
    assert [len(job.batches) for job in cut] == [3, 3]
    whole = [dataclasses.replace(job, batches=batches) for job in cut]
    runs_cut = [run_levels(job, Backend.LOCAL) for job in cut]
    runs_whole = [run_levels(job, Backend.LOCAL) for job in whole]
    for job_cut, job_whole in zip(runs_cut, runs_whole, strict=True):
        for level_cut, level_whole in zip(job_cut, job_whole, strict=True):
            assert _counts([level_cut]) == _counts([level_whole])[:3]
    assert cp_off_bytes_rows(runs_cut, batches, 280) == cp_off_bytes_rows(runs_whole, batches, 280)
    assert len(cp_off_bytes_rows(runs_cut, batches, 280)) == 2 * 2 * 2


def test_page_balance_counts_each_sharded_levels_pages_after_the_last_batch() -> None:
    """Per sharded level, each rank's KV bytes after the trace's last batch over one page's
    bytes (the pools grow batch by batch, so an earlier batch holds fewer); replicated
    levels are left out."""
    deploy = make_deploy(cp_size=2, page_size=16)
    model = model_preset("tiny")
    batches = load_trace(DATA / "long.jsonl", 16).batches
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    job = RankJob(model, deploy, batches, (0, 2, 5), num_pages, ALL_PHASES)
    runs = run_levels(job, Backend.LOCAL)
    page_bytes = kv_bytes_per_page(model, deploy.index_k_dtype, deploy.page_size)
    balance = page_balance(runs, page_bytes)
    assert [b.level for b in balance] == [2, 5]
    for row, run in zip(balance, runs[1:], strict=True):
        last = tuple(p.kv_bytes // page_bytes for p in run.rank_outputs[-1])
        first = tuple(p.kv_bytes // page_bytes for p in run.rank_outputs[0])
        assert row.pages_by_rank == last != first
