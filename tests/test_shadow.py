"""Shadow verification: sampled batches run their fallback too; a mismatch serves the fallback
and kills the phase before the next batch; injected faults are caught with no wrong output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import cpkv.run.pd as pd_mod
from cpkv.cli import app
from cpkv.run.explain import ReplayedKill, explain_trace, plan_to_json
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.loop import sampled
from cpkv.run.pd_check import PdReport
from cpkv.run.shadow import FAULT_POINTS, parse_fault, summarize
from cpkv.run.verify import VerifyReport, shadow_summary, verify_levels
from cpkv_core.config import CpMode, model_preset
from cpkv_core.planning import SplitStrategy
from cpkv_core.runtime import FAILING_KINDS, FAULT_KINDS, Fault
from cpkv_core.traces import load_trace
from phases import BatchPlan, PhaseId, levels_of
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, interleave_trace, make_deploy

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)
LONG = DATA / "long.jsonl"
runner = CliRunner()


def verify_long(
    cp_size: int = 2, rate: float = 1.0, fault: Fault | None = None, levels: tuple[int, ...] = ()
) -> VerifyReport:
    batches = load_trace(LONG, 4).batches
    return verify_levels(
        TINY,
        make_deploy(cp_size, 4),
        batches,
        levels or levels_of(ALL),
        ALL,
        Backend.LOCAL,
        shadow_rate=rate,
        fault=fault,
    )


def test_sampling_is_deterministic_from_batch_and_seed() -> None:
    draws = [sampled(b, 0.3, seed=7) for b in range(2000)]
    assert draws == [sampled(b, 0.3, seed=7) for b in range(2000)]
    assert 500 < sum(draws) < 700
    assert draws != [sampled(b, 0.3, seed=8) for b in range(2000)]
    assert not any(sampled(b, 0.0, 1) for b in range(100))
    assert all(sampled(b, 1.0, 1) for b in range(100))


SAMPLED_AT_SEED_7 = [2, 4, 5, 10, 11, 15, 18, 21, 23, 27, 28, 32, 34, 39, 43, 48, 50, 52, 56, 58]
"""The batches below 60 that ``--shadow-rate 0.3 --shadow-seed 7`` samples, in any process."""
DRAW_IN_A_FRESH_PROCESS = (
    "import json; from cpkv.run.loop import sampled; "
    "print(json.dumps([b for b in range(60) if sampled(b, 0.3, 7)]))"
)


def test_a_rerun_in_another_process_samples_the_same_batches() -> None:
    """The draw depends on (seed, batch) alone: this process and a fresh interpreter with
    another ``PYTHONHASHSEED`` (a salted ``hash()`` would differ) draw the pinned set."""
    assert [b for b in range(60) if sampled(b, 0.3, 7)] == SAMPLED_AT_SEED_7
    ours = os.environ.get("PYTHONHASHSEED", "")
    other = str(int(ours) + 1) if ours.isdigit() else "0"
    root = str(Path(__file__).resolve().parents[1])
    rerun = subprocess.run(
        [sys.executable, "-c", DRAW_IN_A_FRESH_PROCESS],
        env=os.environ | {"PYTHONHASHSEED": other, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(rerun.stdout) == SAMPLED_AT_SEED_7


def test_every_batch_shadowed_matches_and_main_bytes_are_unchanged() -> None:
    plain, shadowed = verify_long(rate=0.0), verify_long(rate=1.0)
    assert shadowed.ok
    summary = shadow_summary(shadowed)
    rows = [r for lv in shadowed.levels for r in lv.rows]
    assert summary.sampled == len(rows) and summary.mismatches == 0
    assert summary.compared > 0 and summary.bytes > 0
    # NOTE: shadow runs count under their own tag; the served path's bytes stay the same.
    plain_rows = [r for lv in plain.levels for r in lv.rows]
    assert [r.gathered_bytes_by_rank for r in rows] == [
        r.gathered_bytes_by_rank for r in plain_rows
    ]
    assert all(r.shadow_bytes > 0 for r in rows if r.shadow and r.shadow.compared)
    assert shadow_summary(plain).sampled == 0


@pytest.mark.parametrize(
    ("phase", "kind"),
    [
        (p, k)
        for p, point in FAULT_POINTS.items()
        for k in FAULT_KINDS[point]
        if k not in FAILING_KINDS  # NOTE: they fail a batch: tests/test_failed_batches.py
    ],
)
def test_injected_fault_is_caught_killed_and_never_delivered(phase: int, kind: str) -> None:
    fault = parse_fault(f"{phase}:{kind}")
    assert fault is not None
    unguarded = verify_long(rate=0.0, fault=fault, levels=(phase,))
    assert not unguarded.ok, "the fault must corrupt outputs when nothing guards them"
    report = verify_long(rate=1.0, fault=fault, levels=(phase,))
    assert report.ok, "a caught fault delivers the fallback's (correct) outputs"
    summary = shadow_summary(report)
    assert summary.fault_caught and summary.wrong_outputs_delivered == 0
    rows = report.levels[0].rows
    kill = next(k for k in summary.kills if k.phase == phase)
    later = [r for r in rows if r.batch > kill.batch]
    assert later, "the trace must have batches after the kill"
    for row in later:
        decision = row.batch_plan.decisions[phase - 1]
        assert not decision.active
        assert any(
            str(r).startswith(f"KILLED batch={kill.batch} max_diff=") for r in decision.reasons
        ), decision


@pytest.mark.parametrize("fault_text", ["4:row", "5:drop", "5:row", "5:owner"])
def test_fault_in_the_page_interleave_is_caught_killed_and_never_delivered(
    fault_text: str,
) -> None:
    """Round-robin: phase 4's page interleave and phase 5's direct write under it."""
    fault = parse_fault(fault_text)
    assert fault is not None
    phase = int(fault_text[0])
    deploy = make_deploy(2, 4, CpMode.ROUND_ROBIN_SPLIT)
    batches = interleave_trace(2, 4, 3)

    def run(rate: float) -> VerifyReport:
        return verify_levels(
            TINY, deploy, batches, (phase,), ALL, Backend.LOCAL, shadow_rate=rate, fault=fault
        )

    assert not run(0.0).ok, "the fault must corrupt outputs when nothing guards them"
    report = run(1.0)
    assert report.ok, "a caught fault delivers the fallback's (correct) outputs"
    summary = shadow_summary(report)
    assert summary.fault_caught and summary.wrong_outputs_delivered == 0
    kill = next(k for k in summary.kills if k.phase == phase)
    rows = report.levels[0].rows
    assert rows[kill.batch].batch_plan.plan.split is SplitStrategy.PAGE_INTERLEAVED
    later = [r for r in rows if r.batch > kill.batch]
    assert later, "the trace must have batches after the kill"
    for row in later:
        assert not row.batch_plan.decisions[phase - 1].active


def test_phase_4_fault_at_level_5_is_caught_with_no_wrong_output() -> None:
    """Phase 5's fallback keeps phase 4's split, so each active phase is checked in turn."""
    report = verify_long(rate=1.0, fault=parse_fault("4"), levels=(5,), cp_size=3)
    assert report.ok
    kills = shadow_summary(report).kills
    assert 4 in {k.phase for k in kills}
    # explain replays the live kills (--killed PHASE@BATCH) and then decides every batch
    # as the live run did: phase, plan and every reason code.
    live = [_decided(row.batch_plan) for row in report.levels[0].rows]
    batches, deploy = load_trace(LONG, 4).batches, make_deploy(3, 4)
    replayed = [ReplayedKill(PhaseId(k.phase), k.batch) for k in kills]
    explained = explain_trace(batches, ALL, deploy, None, replayed)
    assert [_decided(plan) for plan in explained.plans] == live
    assert [_decided(plan) for plan in explain_trace(batches, ALL, deploy).plans] != live


def _decided(plan: BatchPlan) -> dict[str, Any]:
    """A batch's decision without the reasons' values (a live kill carries its max_diff)."""
    document = plan_to_json(plan)
    for decision in document["phases"]:
        del decision["reasons"]
    return document


def test_explain_killed_shows_killed_and_refuses_bad_input() -> None:
    args = ["explain", str(LONG), "--phases", "all", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(app, [*args, "--killed", "5@0", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["killed"] == [{"phase": 5, "batch": 0, "cause": None}]
    assert document["batches"][0]["phase"] == 5
    for batch in document["batches"][1:]:
        assert "KILLED batch=0 replayed=--killed" in batch["phases"][4]["reasons"]
    for bad, words in [("5@9", "no batch 9"), ("7@0", "PHASE must be 1..5"), ("5", "PHASE@BATCH")]:
        result = runner.invoke(app, [*args, "--killed", bad])
        assert result.exit_code == 2 and words in result.stderr, result.output


def test_verify_json_has_a_shadow_section(tmp_path: Path) -> None:
    args = ["verify", str(LONG), "--phases", "all", "--cp-size", "2", "--page-size", "4"]
    args += ["--backend", "local", "--shadow-rate", "1", "--inject-fault", "5", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    shadow = json.loads(result.stdout)["shadow"]
    assert shadow["rate"] == 1.0 and shadow["fault"] == "5:drop" and shadow["fault_caught"]
    assert shadow["phases_killed"] == [5] and shadow["wrong_outputs_delivered"] == 0
    assert shadow["sampled"] == 24 and shadow["mismatches"] == 1


def test_verify_text_names_the_catch() -> None:
    args = ["verify", str(LONG), "--phases", "1", "--cp-size", "2", "--page-size", "4"]
    result = runner.invoke(
        app, [*args, "--backend", "local", "--shadow-rate", "1", "--inject-fault", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "injected fault 1:owner: CAUGHT" in result.stdout
    assert "phase 1 killed at level 1 batch 0" in result.stdout


def test_shadow_rate_comes_from_env_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["verify", str(LONG), "--phases", "1", "--cp-size", "2", "--page-size", "4"]
    args += ["--backend", "local", "--json"]
    monkeypatch.setenv("CPKV_SHADOW_RATE", "0.5")
    result = runner.invoke(app, args)
    assert json.loads(result.stdout)["shadow"]["rate"] == 0.5
    monkeypatch.delenv("CPKV_SHADOW_RATE")
    config = tmp_path / "cpkv.toml"
    config.write_text("shadow-rate = 1\n")
    result = runner.invoke(app, [*args, "--config", str(config)])
    assert json.loads(result.stdout)["shadow"]["sampled"] == 8


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--shadow-rate", "1.5"], "SHADOW_RATE_OUT_OF_RANGE"),
        (["--inject-fault", "2"], "PHASE in 1, 3, 4, 5"),
        (["--inject-fault", "5:wrong"], "takes KIND drop, row, owner"),
    ],
)
def test_bad_shadow_options_are_bad_input(args: list[str], words: str) -> None:
    base = ["verify", str(LONG), "--cp-size", "2", "--page-size", "4", "--backend", "local"]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2, result.output
    assert words in result.stderr


class Reached(Exception):
    """Raised by a spy once it has seen what a command handed down."""


def test_shadow_options_reach_pd_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, Fault | None]] = []

    def gloo(jobs: list[RankJob], *args: object, **kwargs: object) -> None:
        seen.extend((job.shadow_rate, job.fault) for job in jobs)
        raise Reached

    monkeypatch.setattr(pd_mod, "run_jobs_on_gloo", gloo)
    args = ["pd", str(LONG), "--cp-size", "2", "--page-size", "4", "--shadow-rate", "0.25"]
    result = runner.invoke(app, [*args, "--inject-fault", "3"])
    assert isinstance(result.exception, Reached), result.output
    assert seen == [(0.25, parse_fault("3"))]


def test_pd_report_carries_the_shadow_summary() -> None:
    report = PdReport(2, (), (), summarize(1.0, "5:drop", [], 0))
    assert report.to_json()["shadow"]["fault"] == "5:drop"
    assert "shadow" not in PdReport(2, ()).to_json()
