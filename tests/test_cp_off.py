"""Per-batch CP off: the gate sends short batches down the ``none`` split, the none split's
host plan gives every rank every token and gathers nothing, and every level still equals the
reference when some batches split and some do not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cpkv.bench.cp_off import CpOffFigure, CpOffTime, timed_batches
from cpkv.cli import app
from cpkv.run.explain import explain_trace
from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, SplitGate, model_preset
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    RequestSpec,
    ScheduledBatch,
    Scheduler,
    SplitStrategy,
    build_host_plan,
    owner_of_page,
)
from cpkv_core.planning.segments import build_segments
from cpkv_core.traces import load_trace
from phases import BatchPlan, Gate, PhaseId, levels_of
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
ALL = frozenset(PhaseId)
runner = CliRunner()


def deploy_with_min(cp_min_tokens: int, cp_size: int = 4, page_size: int = 4) -> DeploymentConfig:
    """The minimum alone decides: SGLang's gate is off (``split-anyway``)."""
    deploy = make_deploy(cp_size, page_size, split_gate=SplitGate.SPLIT_ANYWAY)
    return deploy.model_copy(update={"cp_min_tokens": cp_min_tokens})


def schedule(deploy: DeploymentConfig, *requests: RequestSpec) -> list[ScheduledBatch]:
    """One batch per request after the first, all on one scheduler."""
    scheduler = Scheduler(512, deploy.page_size, deploy.cp_size)
    return [scheduler.schedule(BatchSpec(i, (r,))) for i, r in enumerate(requests)]


def texts(index: int, plan: BatchPlan) -> list[str]:
    """The reasons of ``plan``'s decision ``index`` (phase ``index + 1``) as text."""
    return [str(r) for r in plan.decisions[index].reasons]


def test_a_short_batch_runs_unsplit_and_says_why() -> None:
    deploy = deploy_with_min(100)
    (batch,) = schedule(deploy, RequestSpec("a", 0, 40))
    plan = Gate(ALL, deploy).decide(batch)
    assert str(plan.cp_off) == "CP_OFF tokens=40 min=100"
    assert plan.cp_off is not None and plan.cp_off.values == (("tokens", 40), ("min", 100))
    assert plan.plan == ExecutionPlan(
        SplitStrategy.NONE,
        KvWriteStrategy.OWNER_FILTERED,
        KvReadStrategy.CURRENT_REUSE,
        OutputStrategy.LOCAL_LAST_TOKEN,
    )
    assert plan.phase == 3
    assert texts(0, plan) == ["CP_OFF tokens=40 min=100"]
    assert texts(3, plan) == ["CP_OFF tokens=40 min=100"]
    assert texts(4, plan) == ["NEEDS_INACTIVE phase=4", "CP_OFF tokens=40 min=100"]


def test_an_unsplit_batch_with_history_materializes_and_level_0_reads_its_own_pool() -> None:
    deploy = deploy_with_min(100)
    first, second = schedule(deploy, RequestSpec("a", 0, 40), RequestSpec("a", 40, 30))
    gate = Gate(ALL, deploy)
    gate.decide(first)
    plan = gate.decide(second)
    assert plan.plan.kv_read is KvReadStrategy.MATERIALIZED_UNIQUE
    assert [str(r) for r in plan.decisions[2].reasons] == ["HAS_HISTORY rid=a prefix_len=40"]
    baseline = Gate(frozenset(), deploy).decide(second)
    assert baseline.phase == 0 and baseline.plan == ExecutionPlan.unsplit()


def test_a_batch_at_the_minimum_is_split_and_cp_size_1_is_never_off() -> None:
    (batch,) = schedule(deploy_with_min(40), RequestSpec("a", 0, 40))
    assert Gate(ALL, deploy_with_min(40)).decide(batch).cp_off is None
    single = deploy_with_min(1000, cp_size=1)
    (batch,) = schedule(single, RequestSpec("a", 0, 40))
    plan = Gate(ALL, single).decide(batch)
    assert plan.cp_off is None and plan.plan.split is not SplitStrategy.NONE


def test_rejects_a_plan_that_skips_the_tail_gather_under_a_split() -> None:
    with pytest.raises(ValueError, match="local-last-token requires the none split"):
        dataclasses.replace(
            ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT), output=OutputStrategy.LOCAL_LAST_TOKEN
        )
    with pytest.raises(ValueError, match="the none split requires local-last-token"):
        dataclasses.replace(ExecutionPlan.unsplit(), output=OutputStrategy.NARROW_LAST_TOKEN)


def test_none_segments_give_every_rank_every_token() -> None:
    segs = build_segments(SplitStrategy.NONE, [5, 7, 1], [0, 3, 0], 3, 4)
    assert segs.replicated and segs.num_tokens == 13
    assert segs.num_local.tolist() == [13, 13, 13]
    assert (segs.rank.tolist(), segs.g0.tolist(), segs.row0.tolist()) == (
        [0, 1, 2],
        [0] * 3,
        [0] * 3,
    )
    with pytest.raises(RuntimeError, match="no token has one rank"):
        segs.rank_of_tokens(np.arange(3, dtype=np.int64))


@pytest.mark.parametrize("write", [KvWriteStrategy.REPLICATED, KvWriteStrategy.OWNER_FILTERED])
def test_none_host_plan_writes_owned_pages_from_local_rows_and_gathers_nothing(
    write: KvWriteStrategy,
) -> None:
    deploy = deploy_with_min(1000, cp_size=3, page_size=4)
    (batch,) = schedule(deploy, RequestSpec("a", 0, 23))
    plan = dataclasses.replace(ExecutionPlan.unsplit(), kv_write=write)
    pages = {int(p) for p in batch.requests[0].page_table}
    written: list[int] = []
    for rank in range(3):
        host = build_host_plan(batch, plan, rank)
        assert (host.num_local, host.max_local, host.local_start) == (23, 23, 0)
        assert host.write_from_local and not host.gathers_current
        assert host.table("local_last_requests").tolist() == [0]
        assert host.table("local_last_rows").tolist() == [22]
        src, loc = host.table("write_src0"), host.table("write_loc0")
        assert src.tolist() == loc.tolist()  # one request from loc 0 at page 0: row g is loc g
        rank_pages = {int(p) for p in host.table("write_loc0") // 4}
        if write is KvWriteStrategy.REPLICATED:
            assert rank_pages == pages
        else:
            assert all(owner_of_page(p, 3) == rank for p in rank_pages)
            written += rank_pages
    if write is KvWriteStrategy.OWNER_FILTERED:
        assert sorted(written) == sorted(pages)  # every page once, by its owner


TRACES = {"mixed": 30, "long": 280}
"""Trace -> a minimum that splits some of its batches and not others."""


@pytest.mark.parametrize("cp_mode", list(CpMode))
@pytest.mark.parametrize(("cp_size", "page_size"), [(2, 4), (3, 1), (4, 16)])
@pytest.mark.parametrize("trace", list(TRACES))
def test_every_level_matches_reference_with_some_batches_unsplit(
    trace: str, cp_size: int, page_size: int, cp_mode: CpMode
) -> None:
    deploy = make_deploy(cp_size, page_size, cp_mode, split_gate=SplitGate.SPLIT_ANYWAY)
    deploy = deploy.model_copy(update={"cp_min_tokens": TRACES[trace]})
    batches = load_trace(DATA / f"{trace}.jsonl", page_size).batches
    report = verify_levels(TINY, deploy, batches, levels_of(ALL), ALL, Backend.LOCAL)
    unsplit = [b.num_tokens < TRACES[trace] for b in batches]
    assert True in unsplit and False in unsplit
    for level in report.levels:
        assert [r.comparison.max_abs_diff for r in level.rows] == [0.0] * len(batches)
        assert all(r.comparison.topk_equal for r in level.rows), level.level
        assert [r.batch_plan.cp_off is not None for r in level.rows] == unsplit
        for row, off in zip(level.rows, unsplit, strict=True):
            tags = row.gathered_bytes_by_tag
            if off:
                assert tags.get("current_kv", 0) == tags.get("tail_hidden", 0) == 0
                assert level.level >= 2 or sum(row.gathered_bytes_by_rank) == 0
            else:
                assert tags.get("tail_hidden", 0) > 0
    assert report.ok


def test_explain_counts_unsplit_batches_in_the_summary() -> None:
    batches = load_trace(DATA / "long.jsonl", 16).batches
    deploy = deploy_with_min(280, page_size=16)
    report = explain_trace(batches, ALL, deploy)
    summary = report.to_json()["summary"]
    assert summary["cp_off"]["batches"] == 2 and summary["cp_off"]["tokens"] == 275 + 5
    assert summary["fallbacks"]["4"]["CP_OFF"] == 2
    assert summary["reasons_by_phase"]["1"]["CP_OFF"] == 2


def test_verify_takes_the_minimum_from_the_command_line_and_shows_cp_off() -> None:
    args = [
        "verify",
        str(DATA / "long.jsonl"),
        "--phases",
        "all",
        "--cp-size",
        "2",
        "--page-size",
        "16",
        "--nsa-prefill-cp-min-tokens",
        "200",
        "--cp-split-gate",
        "split-anyway",
        "--backend",
        "local",
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [lv["ok"] for lv in doc["levels"]] == [True] * 6
    top = [b for b in doc["batches"] if b["level"] == 5]
    assert [b["cp_off"] and b["cp_off"]["text"] for b in top] == [
        None,
        None,
        "CP_OFF tokens=5 min=200",
        None,
    ]
    assert top[2]["plan"]["split"] == "none" and top[2]["gathered_bytes_by_tag"]["tail_hidden"] == 0


def test_explain_takes_the_minimum_from_a_config_key(tmp_path: Path) -> None:
    config = tmp_path / "cpkv.toml"
    config.write_text("nsa-prefill-cp-min-tokens = 280\n")
    args = ["explain", str(DATA / "long.jsonl"), "--phases", "all", "--cp-size", "4"]
    result = runner.invoke(app, [*args, "--page-size", "16", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["deployment"]["cp_min_tokens"] == 280
    assert [b["plan"]["split"] for b in doc["batches"]] == [
        "page-aligned-zigzag",
        "none",
        "none",
        "page-aligned-zigzag",
    ]


@pytest.mark.parametrize(
    ("on_over_off", "break_even"),
    [
        ((2.0, 0.9, 1.1, 0.8, 0.5), 4),
        ((2.0, 1.5, 1.2, 1.1, 1.0), None),
        ((0.9, 0.8, 0.7, 0.6, 0.5), 1),
    ],
)
def test_break_even_is_the_smallest_size_from_which_cp_on_stays_faster(
    on_over_off: tuple[float, ...], break_even: int | None
) -> None:
    times = [CpOffTime(i + 1, 1, ratio, 1.0) for i, ratio in enumerate(on_over_off)]
    assert CpOffFigure(0, 4, [], times, 5).break_even_tokens == break_even


def test_timed_batches_cut_long_batches_into_chunk_sized_requests() -> None:
    batches = timed_batches((64, 1024, 2500))
    assert [b.num_tokens for b in batches] == [64, 1024, 2500]
    assert [[r.extend_len for r in b.requests] for b in batches] == [[64], [1024], [834, 833, 833]]
