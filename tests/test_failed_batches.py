"""A batch that fails in a phase's path is rolled back, the phase is killed and the batch rerun,
and the run goes on; with no phase left to drop, the run stops, named.

In-process ranks, then one gloo group for every case that must hold on real processes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.render.batches import print_failures
from cpkv.run.explain import ReplayedKill, explain_trace, plan_to_json
from cpkv.run.jobs import Backend, RankJob, RankRun
from cpkv.run.runner import _job_runs, run_jobs_rank
from cpkv.run.shadow import parse_fault
from cpkv.run.verify import VerifyReport, verify_levels, verify_runs
from cpkv_core.config import model_preset
from cpkv_core.dist import run_local, spawn_group
from cpkv_core.planning import DecisionPoint, pages_for_trace
from cpkv_core.runtime import FailureCause, LocalFailure
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.failures import agree
from cpkv_core.traces import load_trace
from phases import BatchPlan, PhaseId
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)
LONG = DATA / "long.jsonl"
BATCHES = load_trace(LONG, 4).batches
runner = CliRunner()


@functools.cache
def verify_long(fault: str | None, levels: tuple[int, ...] = (5,), debug: bool = False) -> Any:
    """The run of ``long.jsonl`` at ``levels`` with ``fault`` (one run per arguments: the
    tests that read the same run share it)."""
    return verify_levels(
        TINY,
        make_deploy(2, 4),
        BATCHES,
        levels,
        ALL,
        Backend.LOCAL,
        debug_checks=debug,
        fault=parse_fault(fault),
    )


def kills_of(report: VerifyReport) -> list[tuple[int, int, str, tuple[str, ...], bool]]:
    """``(phase, batch, cause, points, attributed)`` of every kill, in order."""
    assert report.failures is not None
    return [
        (k.kill.phase, k.kill.batch, k.kill.cause, k.kill.points, k.kill.attributed)
        for k in report.failures.kills
    ]


def killed_reason(plan: BatchPlan, phase: int) -> list[str]:
    decision = plan.decisions[phase - 1]
    assert not decision.active
    return [str(r) for r in decision.reasons if str(r).startswith("KILLED")]


@pytest.mark.parametrize(
    ("fault", "phase", "batch", "point", "rerun_phase"),
    [
        ("5:raise", 5, 0, "kv_write", 4),  # in the step, between collectives: a guarded region
        ("4:raise@1", 4, 1, "split", 2),  # in the host half: the first vote (5 needs 4)
        ("1:raise", 1, 0, "output", 5),  # in the tail, after its gather (5 needs no 1)
    ],
)
def test_a_raise_in_a_phase_kills_it_and_reruns_the_batch(
    fault: str, phase: int, batch: int, point: str, rerun_phase: int
) -> None:
    report = verify_long(fault)
    assert report.ok, "every delivered output equals the reference"
    assert kills_of(report) == [(phase, batch, "error", (point,), True)]
    failures = report.failures
    (kill,) = failures.kills
    assert kill.level == 5 and kill.kill.ranks == (1,), "one rank raised, every rank agreed"
    assert "PathError: injected fault" in kill.kill.message
    (rerun,) = failures.reruns
    assert (rerun.batch, [a.phase for a in rerun.failed]) == (batch, [5])
    assert (failures.rerun_count, failures.batches_lost, failures.fault_caught) == (1, 0, True)
    rows = report.levels[0].rows
    assert rerun.phase == rows[batch].batch_plan.phase == rerun_phase
    assert all(row.batch_plan.phase == 5 for row in rows[:batch])
    assert killed_reason(rows[batch].batch_plan, phase) == [
        f"KILLED cause=error batch={batch} ranks=1 at={point}"
    ]


def test_nonfinite_values_are_blamed_where_they_are_seen() -> None:
    written = verify_long("5:nonfinite")
    assert written.ok and kills_of(written) == [(5, 0, "nonfinite", ("kv_write",), True)]
    # NOTE: NaN outputs after a finite tail input (1:nonfinite) are blamed on the tail in
    # test_every_rank_agrees_on_gloo.
    # NaN reused keys make NaN hidden states: which phase cannot be told, so the highest
    # active phase is dropped, then the next, each once, until the rerun is clean.
    unknown = verify_long("3:nonfinite")
    assert unknown.ok
    assert kills_of(unknown) == [(p, 0, "nonfinite", (), False) for p in (5, 4, 3)]
    (rerun,) = unknown.failures.reruns
    assert [a.phase for a in rerun.failed] == [5, 4, 3] and rerun.phase == 2
    assert killed_reason(unknown.levels[0].rows[1].batch_plan, 4) == [
        "KILLED cause=nonfinite batch=0 ranks=1 attributed=no"
    ]


def test_a_nan_index_k_scale_written_is_blamed_on_the_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The direct write (the one strategy that stores its source rows in order) stores a
    NaN index K scale while its latent stays finite: the rows the batch wrote are checked
    whole, so phase 5 is killed at the write and the batch rerun on phase 4's write."""
    real = engine_mod.write_rows

    def nan_scale(pool: Any, layer: int, source: Any, rows: Any, dest: Any) -> None:
        if rows is None:
            scale = torch.full_like(source.index_k_scale, float("nan"))
            source = dataclasses.replace(source, index_k_scale=scale)
        real(pool, layer, source, rows, dest)

    monkeypatch.setattr(engine_mod, "write_rows", nan_scale)
    report = verify_levels(TINY, make_deploy(2, 4), BATCHES, (5,), ALL, Backend.LOCAL)
    assert report.ok
    assert kills_of(report)[0] == (5, 0, "nonfinite", ("kv_write",), True)


@pytest.mark.parametrize(("fault", "batch"), [("5:owner", 0), ("5:drop@3", 3)])
def test_a_debug_check_kills_the_phase_it_blames(fault: str, batch: int) -> None:
    """``5:owner`` leaves a page its owner never holds: the batch's own outputs are right, so
    without shadow only the debug checks see it (unguarded, a later batch reads it). What
    the checks recorded of a failed attempt is dropped with it: ``5:drop@3``'s missing row
    would fail the rerun's coverage check otherwise."""
    if batch == 0:
        assert not verify_long(fault).ok
    report = verify_long(fault, debug=True)
    assert report.ok and kills_of(report) == [(5, batch, "debug_check", ("kv_write",), True)]
    assert report.failures.fault_caught and not report.failures.failing
    (kill,) = report.failures.kills
    assert kill.kill.ranks == (0, 1)
    assert "differ from their owners' pools after the write" in kill.kill.message
    assert report.levels[0].rows[batch].batch_plan.phase == 4


def test_the_verdict_names_a_point_only_when_no_rank_saw_the_failure_before_it() -> None:
    """A rank whose outputs are NaN after a finite tail input blames the tail, unless
    another rank saw NaNs before it; a certain sighting (a NaN row written) wins."""
    tail = LocalFailure(FailureCause.NONFINITE, frozenset({DecisionPoint.OUTPUT}), "t", False)
    upstream = LocalFailure(FailureCause.NONFINITE, frozenset(), "u", False)
    write = LocalFailure(FailureCause.NONFINITE, frozenset({DecisionPoint.KV_WRITE}), "w")
    error = LocalFailure(FailureCause.ERROR, frozenset({DecisionPoint.SPLIT}), "e")
    cases = [
        ((tail, None), ("nonfinite", ("output",), (0,))),
        ((tail, upstream), ("nonfinite", (), (0, 1))),
        ((upstream, write), ("nonfinite", ("kv_write",), (0, 1))),
        ((write, error), ("error", ("split",), (0, 1))),
        ((None, None), None),
    ]
    for votes, want in cases:
        got = run_local(2, lambda comm, votes=votes: agree(comm, 7, votes[comm.rank]))
        assert got[0] == got[1], "every rank holds the same verdict"
        verdict = got[0]
        if want is None:
            assert verdict is None
            continue
        assert verdict is not None and verdict.batch == 7
        assert (verdict.cause, verdict.points, verdict.ranks) == want, votes


def _failing_write(rank: int) -> Callable[..., None]:
    """A KV write that raises on ``rank`` under every strategy: not any phase's own bug."""
    real = engine_mod.write_rows

    def write(*args: Any) -> None:
        if threading.current_thread().name == f"cpkv-local-rank{rank}":
            raise OSError("disk on fire")
        real(*args)

    return write


def test_a_failure_with_no_phase_left_to_drop_stops_the_run_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_mod, "write_rows", _failing_write(1))
    head = r"batch 0 \(level {}\) failed with cause=error ranks=1 at=kv_write: OSError: disk"
    with pytest.raises(RuntimeError, match=head.format(2) + r".*phase 2's path, which cannot"):
        verify_long.__wrapped__(None, levels=(2,))  # NOTE: patched: never cached
    with pytest.raises(RuntimeError, match=head.format(0) + r".*phase 0's path \(kv_write\)"):
        verify_long.__wrapped__(None, levels=(0,))


def test_a_failure_that_cannot_be_told_drops_every_phase_once_then_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1's hidden states turn NaN after the last layer from batch 1 on (a bug in no
    phase's path, after every write): phases 5, 4 and 1 (3 is off: batch 1 has history) are
    dropped once each, the batch rerun once per drop, and then only phase 2 is left, which
    a batch cannot drop: the run stops."""
    real = engine_mod.finish_layer
    calls = [0]

    def finish(*args: Any) -> torch.Tensor:
        hidden: torch.Tensor = real(*args)
        if threading.current_thread().name != "cpkv-local-rank1":
            return hidden
        calls[0] += 1
        last_layer = calls[0] % TINY.num_layers == 0
        if calls[0] <= TINY.num_layers or not last_layer:
            return hidden
        return torch.full_like(hidden, float("nan"))

    monkeypatch.setattr(engine_mod, "finish_layer", finish)
    with pytest.raises(RuntimeError) as caught:
        verify_long.__wrapped__(None)
    message = str(caught.value)
    assert "batch 1 (level 5) failed with cause=nonfinite ranks=" in message
    assert "the only active phase left, 2, cannot be dropped" in message
    dropped = re.findall(r"phase (\d) was dropped for it first", message)
    assert dropped == ["5", "4", "1"]
    assert calls[0] == TINY.num_layers * (1 + 1 + len(dropped)), "one rerun per phase killed"


def _decided(plan: BatchPlan) -> dict[str, Any]:
    """A batch's decision without the reasons' values (a live kill names its ranks)."""
    document = plan_to_json(plan)
    for decision in document["phases"]:
        del decision["reasons"]
    return document


def test_explain_replays_a_failed_batchs_kill() -> None:
    report = verify_long("5:raise@1")
    live = [_decided(row.batch_plan) for row in report.levels[0].rows]
    ((level, kill),) = [(k.level, k.kill) for k in report.failures.kills]
    assert (level, kill.replay) == (5, "5@1:error")
    deploy = make_deploy(2, 4)
    replayed = [ReplayedKill(PhaseId(kill.phase), kill.batch, kill.cause)]
    explained = explain_trace(BATCHES, ALL, deploy, None, replayed)
    assert [_decided(plan) for plan in explained.plans] == live
    assert [_decided(plan) for plan in explain_trace(BATCHES, ALL, deploy).plans] != live
    for plan in explained.plans[1:]:  # NOTE: from the failed batch on, with its cause
        reasons = plan_to_json(plan)["phases"][4]["reasons"]
        assert "KILLED cause=error batch=1 replayed=--killed" in reasons, reasons
    args = ["explain", str(LONG), "--phases", "all", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--killed", "5@1:bogus"])
    assert result.exit_code == 2 and "CAUSE must be error, debug_check, nonfinite" in result.stderr


def test_verify_json_carries_the_kill_and_the_rerun_and_exits_0() -> None:
    args = ["verify", str(LONG), "--phases", "all", "--cp-size", "2", "--page-size", "4"]
    args += ["--backend", "local", "--inject-fault", "5:raise", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] and all(b["ok"] for b in document["batches"])
    assert {b["level"] for b in document["batches"]} == {0, 1, 2, 3, 4, 5}
    failures = document["failures"]
    (kill,) = failures["kills"]
    assert (kill["level"], kill["phase"], kill["batch"], kill["cause"]) == (5, 5, 0, "error")
    assert (kill["points"], kill["ranks"], kill["replay"]) == (["kv_write"], [1], "5@0:error")
    assert (failures["rerun_count"], failures["batches_lost"]) == (1, 0)
    assert failures["fault"] == "5:raise" and failures["fault_caught"] is True
    assert failures["lost_seconds"] > 0 and failures["rerun_seconds"] > 0
    assert document["shadow"]["fault"] is None, "a failing fault is not the shadow's to catch"


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("5:raise@9", "the trace has no batch 9"),
        ("5:raise@x", "BATCH after @ must be a batch number"),
        ("4:nonfinite", "takes KIND row, raise"),
    ],
)
def test_a_bad_fault_batch_or_kind_is_bad_input(fault: str, words: str) -> None:
    args = ["verify", str(LONG), "--cp-size", "2", "--page-size", "4", "--backend", "local"]
    result = runner.invoke(app, [*args, "--inject-fault", fault])
    assert result.exit_code == 2 and words in result.stderr, result.output


def test_the_text_report_names_the_kill_the_rerun_and_its_cost() -> None:
    report = verify_long("5:raise")
    console = Console(record=True, width=400)
    print_failures(console, report.failures)
    text = console.export_text()
    assert text.startswith("failures: 1 rerun, ") and "0 batches lost" in text
    assert "phase 5 killed at level 5 batch 0 (cause=error ranks=1 at=kv_write: " in text
    assert "level 5 batch 0 rerun on phase 4 after phase 5 failed (error)" in text
    assert text.rstrip().endswith("injected fault 5:raise: CAUGHT")


GLOO_CASES = {
    "5:raise": (False, (5, 0, "error", ("kv_write",), True)),
    "4:raise@1": (False, (4, 1, "error", ("split",), True)),
    "5:owner": (True, (5, 0, "debug_check", ("kv_write",), True)),
    "1:nonfinite": (False, (1, 0, "nonfinite", ("output",), True)),
}
"""Fault -> (debug checks on, the kill): a raise between the step's collectives, one in the
host half, a debug check and a NaN, each on one rank."""


@pytest.mark.gloo
@pytest.mark.usefixtures("forked")
def test_every_rank_agrees_on_gloo() -> None:
    """One gloo group runs every case: each rank records the same kills, the rank that
    raised takes part in the rerun, and every batch equals the reference."""
    jobs = [
        RankJob(
            TINY,
            make_deploy(2, 4),
            BATCHES,
            (5,),
            pages_for_trace(BATCHES, 4, 2),
            enabled=ALL,
            debug_checks=debug,
            fault=parse_fault(fault),
            batch_timeout_s=60.0,
        )
        for fault, (debug, _) in GLOO_CASES.items()
    ]
    per_rank: list[list[list[RankRun] | None]] = spawn_group(
        2, run_jobs_rank, (tuple(jobs),), timeout_s=300.0
    )
    for index, (fault, (_, want)) in enumerate(GLOO_CASES.items()):
        runs = [per_rank[rank][index] for rank in (0, 1)]
        assert runs[0] is not None and runs[1] is not None
        kills = [
            [(k.phase, k.batch, k.cause, k.points, k.attributed) for k in run[0].kills]
            for run in runs
        ]
        assert kills == [[want], [want]], fault
        assert [len(r[0].failed) for r in runs] == [1, 1], fault
    for job, level_runs in zip(jobs, _job_runs(jobs, per_rank), strict=True):
        report = verify_runs(job, level_runs)
        assert report.ok and report.failures is not None and report.failures.batches_lost == 0
