"""Scheduling as SGLang 0.5.23 does: the per-batch split gate (zigzag, interleave) with its
reasons, the all-gathers padded as the server pads them, and chunks on page boundaries when
KV sharding is on.

``tests/data/sglang_cp_cases.json`` holds SGLang's own answers: ``scripts/sglang_cp_cases.py``
ran the wheel's ``srt/layers/cp`` code (``can_apply``, ``build_metadata``, the padding and
``gather_kv_cache`` on every rank) on each batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.run.explain import explain_trace
from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv.synth import SchedulerConfig, Session, Turn, Workload, effective_scheduler, schedule
from cpkv_core.config import CpMode, DeploymentConfig, SplitGate, model_preset
from cpkv_core.planning import BatchSpec, RequestSpec, ScheduledBatch, Scheduler, build_host_plan
from cpkv_core.planning.chunking import (
    mid_page_resumes,
    mid_page_warning,
    sharded_chunk_size,
    sharded_next_chunk,
)
from cpkv_core.traces import load_trace, parse_trace_text
from phases import BatchPlan, Gate, PhaseId, levels_of
from tests.conftest import DATA, make_deploy, mixed_trace, tiny_row_bytes

TINY = model_preset("tiny")
ALL = frozenset(PhaseId)
CASES: list[dict[str, Any]] = json.loads((DATA / "sglang_cp_cases.json").read_text())["cases"]
MODES = {"zigzag": CpMode.IN_SEQ_SPLIT, "interleave": CpMode.ROUND_ROBIN_SPLIT}
runner = CliRunner()


def decide(
    deploy: DeploymentConfig, *requests: RequestSpec, enabled: frozenset[PhaseId] = ALL
) -> tuple[ScheduledBatch, BatchPlan]:
    """Schedules earlier chunks for every request with a prefix, then ``requests`` as one
    batch; returns (scheduled batch, its plan)."""
    scheduler = Scheduler(4096, deploy.page_size, deploy.cp_size)
    gate = Gate(enabled, deploy)
    earlier = tuple(RequestSpec(r.rid, 0, r.prefix_len) for r in requests if r.prefix_len)
    if earlier:
        gate.decide(scheduler.schedule(BatchSpec(0, earlier)))
    batch = scheduler.schedule(BatchSpec(1, requests))
    return batch, gate.decide(batch)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['mode']}-cp{c['cp_size']}")
def test_the_gate_and_the_gather_rows_agree_with_sglang_on_every_case(case: dict[str, Any]) -> None:
    deploy = make_deploy(case["cp_size"], 64, MODES[case["mode"]])
    requests = [
        RequestSpec(f"r{i}", prefix, extend)
        for i, (prefix, extend) in enumerate(
            zip(case["prefix_lens"], case["extend_lens"], strict=True)
        )
    ]
    batch, plan = decide(deploy, *requests, enabled=frozenset())
    splits = plan.cp_off is None and deploy.cp_size > 1
    assert splits == case["splits"], plan.cp_off
    if case["splits"]:
        rows = {build_host_plan(batch, plan.plan, r).max_local for r in range(deploy.cp_size)}
        assert rows == {case["gather_rows"]}


@pytest.mark.parametrize(
    ("cp_size", "tokens", "splits"), [(4, 7, False), (4, 8, True), (3, 5, False), (3, 6, True)]
)
def test_zigzag_needs_2_cp_current_tokens_in_every_request(
    cp_size: int, tokens: int, splits: bool
) -> None:
    deploy = make_deploy(cp_size, 4)
    _, plan = decide(deploy, RequestSpec("r1", 0, 300), RequestSpec("r3", 40, tokens))
    if splits:
        assert plan.cp_off is None and plan.plan.split.value != "none"
        return
    assert str(plan.cp_off) == f"CP_OFF rule=sglang rid=r3 tokens={tokens} need={2 * cp_size}"
    assert plan.cp_off is not None and dict(plan.cp_off.values)["need"] == 2 * cp_size
    assert plan.plan.split.value == "none"
    assert [str(r) for r in plan.decisions[3].reasons] == [str(plan.cp_off)]  # phase 4


@pytest.mark.parametrize(
    ("cp_size", "tokens", "splits"), [(4, 3, False), (4, 4, True), (3, 2, False), (3, 3, True)]
)
def test_interleave_needs_cp_current_tokens_in_the_batch(
    cp_size: int, tokens: int, splits: bool
) -> None:
    deploy = make_deploy(cp_size, 4, CpMode.ROUND_ROBIN_SPLIT)
    one = RequestSpec("r1", 64, 1)  # NOTE: the prefix does not count, only current tokens
    _, plan = decide(deploy, one, RequestSpec("r2", 0, tokens - 1))
    if splits:
        assert plan.cp_off is None
        return
    assert str(plan.cp_off) == f"CP_OFF rule=sglang tokens={tokens} need={cp_size}"


def test_cp_1_gives_no_reason_and_split_anyway_splits_what_sglang_would_not() -> None:
    _, single = decide(make_deploy(1, 4), RequestSpec("a", 0, 1))
    assert single.cp_off is None
    anyway = make_deploy(4, 4, split_gate=SplitGate.SPLIT_ANYWAY)
    _, plan = decide(anyway, RequestSpec("a", 0, 300), RequestSpec("b", 0, 1))
    assert plan.cp_off is None and plan.plan.split.value == "zigzag"


def test_sglang_rule_comes_before_the_minimum() -> None:
    deploy = make_deploy(2, 4).model_copy(update={"cp_min_tokens": 1000})
    _, short = decide(deploy, RequestSpec("a", 0, 300), RequestSpec("b", 0, 3))
    assert str(short.cp_off) == "CP_OFF rule=sglang rid=b tokens=3 need=4"
    _, small = decide(deploy, RequestSpec("a", 0, 300))
    assert str(small.cp_off) == "CP_OFF tokens=300 min=1000"


def test_round_robin_gathers_pad_each_rank_to_a_multiple_of_cp_rows() -> None:
    # NOTE: 5 tokens on 4 ranks: 2/1/1/1 rows, padded to 4 a rank (SGLang's interleave);
    # zigzag pads only to the busiest rank (5 tokens on 2 ranks: 3/2 rows, 3 a rank, not 4).
    text = '{"batch": 0, "requests": [{"rid": "a", "prefix_len": 0, "extend_len": 5}]}\n'
    batches = parse_trace_text(text, 4).batches
    for mode, cp_size, rows in ((CpMode.ROUND_ROBIN_SPLIT, 4, 4), (CpMode.IN_SEQ_SPLIT, 2, 3)):
        deploy = make_deploy(cp_size, 4, mode)
        report = verify_levels(TINY, deploy, batches, (0,), frozenset(), Backend.LOCAL)
        assert report.ok
        (row,) = report.levels[0].rows
        kv_bytes = tiny_row_bytes(deploy.index_k_dtype)
        tail_bytes = TINY.hidden_size * 4
        expected = cp_size * rows * (kv_bytes + tail_bytes)
        assert row.gathered_bytes_by_rank == (expected,) * cp_size, mode


ZZ, RR = CpMode.IN_SEQ_SPLIT, CpMode.ROUND_ROBIN_SPLIT


@pytest.mark.parametrize(
    ("trace", "cp_size", "cp_mode", "unsplit"),
    [
        ("mixed", 3, ZZ, [True, True, True, True]),  # every batch has a request below 6
        ("mixed", 2, RR, [False, False, False, True]),  # batch 3: one token
        ("long", 4, RR, [False, False, False, False]),  # 5 tokens on 4 ranks: padded rows
    ],
)
def test_every_level_matches_reference_under_the_sglang_gate(
    trace: str, cp_size: int, cp_mode: CpMode, unsplit: list[bool]
) -> None:
    """Zigzag with some batches unsplit: ``test_engine``'s long-request grid (the default
    gate, cp 1..4); here every batch unsplit, and interleave split, unsplit and padded."""
    deploy = make_deploy(cp_size, 4, cp_mode)
    batches = load_trace(DATA / f"{trace}.jsonl", 4).batches
    report = verify_levels(TINY, deploy, batches, levels_of(ALL), ALL, Backend.LOCAL)
    for level in report.levels:
        assert [r.comparison.max_abs_diff for r in level.rows] == [0.0] * len(batches)
        assert all(r.comparison.topk_equal for r in level.rows), level.level
        assert [r.batch_plan.cp_off is not None for r in level.rows] == unsplit
    assert report.ok


def test_explain_says_rule_sglang_and_split_anyway_comes_from_every_source(
    tmp_path: Path,
) -> None:
    args = ["explain", str(DATA / "long.jsonl"), "--phases", "all", "--cp-size", "4"]
    args += ["--page-size", "16", "--json"]
    doc = json.loads(runner.invoke(app, args).stdout)
    assert doc["batches"][2]["cp_off"]["text"] == "CP_OFF rule=sglang rid=b tokens=3 need=8"
    assert doc["deployment"]["split_gate"] == "sglang"
    config = tmp_path / "cpkv.toml"
    config.write_text('cp-split-gate = "split-anyway"\n')
    for extra, env in (
        (["--cp-split-gate", "split-anyway"], {}),
        (["--config", str(config)], {}),
        ([], {"CPKV_CP_SPLIT_GATE": "split-anyway"}),
    ):
        doc = json.loads(runner.invoke(app, [*args, *extra], env=env).stdout)
        assert doc["batches"][2]["cp_off"] is None, extra
        assert doc["batches"][2]["plan"]["split"] == "zigzag"


def test_sharded_chunk_size_rounds_up_to_a_page_multiple() -> None:
    assert sharded_chunk_size(10000, 64) == 10048
    assert sharded_chunk_size(8192, 64) == 8192
    assert sharded_chunk_size(1, 64) == 64
    with pytest.raises(ValueError, match="requires chunked prefill"):
        sharded_chunk_size(-1, 64)


def test_a_sharded_next_chunk_ends_on_a_page_boundary() -> None:
    assert sharded_next_chunk(0, 1000, 64) == 960
    assert sharded_next_chunk(37, 100, 64) == 91  # 37 + 91 = 128
    assert sharded_next_chunk(37, 20, 64) == 20  # nothing to floor to: a whole budget


def test_synth_with_sharding_rounds_the_chunk_and_never_resumes_mid_page() -> None:
    turns = tuple(Session((Turn(f"t{i}", ((f"doc{i}", 2500 + 37 * i),)),)) for i in range(3))
    workload = Workload("test", turns)
    plain = SchedulerConfig(chunked_prefill_size=1000, max_prefill_tokens=4096)
    sharded = plain.model_copy(update={"kv_cache_sharding": True})
    assert effective_scheduler(sharded).chunked_prefill_size == 1024
    assert mid_page_resumes(schedule(workload, plain), 64)  # 1000 is off the page grid
    batches = schedule(workload, sharded)
    assert mid_page_resumes(batches, 64) == ()
    assert max(b.num_tokens for b in batches) <= 1024
    assert sum(b.num_tokens for b in batches) == sum(2500 + 37 * i for i in range(3))
    with pytest.raises(ValueError, match="requires chunked prefill"):
        schedule(workload, sharded.model_copy(update={"chunked_prefill_size": -1}))


def test_trace_synth_rounds_10000_to_10048_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    args = ["trace", "synth", "--workload", "long-doc", "--size", "small", "--out", str(out)]
    args += ["--chunked-prefill-size", "10000", "--enable-kv-cache-sharding"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["scheduler"]["chunked_prefill_size"] == 10048
    assert doc["chunked_prefill_size_given"] == 10000 and doc["mid_page_resumes"] == 0
    text = runner.invoke(app, args).stdout
    assert "rounded up from 10000 to 10048" in text


def test_a_mid_page_resume_is_run_with_a_warning_when_kv_is_sharded() -> None:
    batches = mixed_trace(4).batches
    warning = mid_page_warning(batches, 4)
    assert warning is not None and "batch 1, rid a, prefix_len 37" in warning
    deploy = make_deploy(2, 4)
    assert explain_trace(batches, ALL, deploy).warnings == (warning,)
    assert explain_trace(batches, frozenset({PhaseId.NARROW_OUTPUT}), deploy).warnings == ()
    aligned = '{"batch": 0, "requests": [{"rid": "a", "prefix_len": 0, "extend_len": 8}]}\n'
    aligned += '{"batch": 1, "requests": [{"rid": "a", "prefix_len": 8, "extend_len": 3}]}\n'
    assert mid_page_warning(parse_trace_text(aligned, 4).batches, 4) is None
    args = ["explain", str(DATA / "mixed.jsonl"), "--phases", "all", "--cp-size", "2"]
    result = runner.invoke(app, [*args, "--page-size", "4", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["warnings"] == [warning]
    assert "warning:" in result.stderr
