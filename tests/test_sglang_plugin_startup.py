"""Loading and starting cpkv's plugin the way an SGLang 0.5.23 server does, on CPU ranks:
SGLang's own ``load_plugins()`` finds it through its entry point and applies its hooks, the
start-up check logs them and the phases on; a wrong SGLang version, a target that does not
resolve, a wrapper that did not land and bad settings each stop the start, loudly."""

from __future__ import annotations

import tempfile
import time
from functools import cache
from pathlib import Path

import pytest

from cpkv_sglang.cpu import refusals
from cpkv_sglang.cpu.batches import BatchShape
from cpkv_sglang.cpu.ranks import TailJob, run_ranks
from cpkv_sglang.cpu.refusals import RefusalReport
from cpkv_sglang.targets import HOOKS, HookGroup
from tests.sglang_cases import NARROW, reports, same_bits

pytestmark = [pytest.mark.gloo, pytest.mark.xdist_group("sglang")]


@cache
def run_scenario(scenario: str) -> RefusalReport:
    """Rank 0's report of ``scenario`` (two ranks where it needs a CP batch)."""
    return refusals.run_scenario(scenario, cp_size=2 if scenario == "no-publish-hook" else 1)


def applied(log: tuple[str, ...]) -> set[HookGroup]:
    """The groups of the hooks SGLang's registry says it applied for cpkv."""
    suffix = " (from: plugin=cpkv, dist=cpkv)"
    return {h.group for h in HOOKS if any(line.endswith(h.target + suffix) for line in log)}


def test_load_plugins_finds_cpkv_by_its_entry_point_and_the_log_names_every_hook() -> None:
    log = reports("interleave-2", True)[0].log
    assert "sglang.srt.plugins:   - cpkv -> cpkv_sglang:register" in log
    assert "sglang.srt.plugins: Loaded plugin cpkv from group sglang.srt.plugins" in log
    for hook in HOOKS:
        line_end = f"Applied 1 hook(s) to {hook.target} (from: plugin=cpkv, dist=cpkv)"
        assert any(line.endswith(line_end) for line in log), hook.target
    assert applied(log) == set(HookGroup)
    started = [line for line in log if line.startswith("cpkv_sglang: cpkv plugin: hooks ")]
    assert len(started) == 1, log
    assert all(hook.target.removeprefix("sglang.srt.") in started[0] for hook in HOOKS)
    assert "phases on: 1 (narrow output); cp 2 round-robin-split" in started[0]
    assert any("phase 4 page-aligned split: runs on cpkv's engine only" in line for line in log)


def test_with_no_phase_on_the_plugin_installs_nothing_and_sglang_runs_as_shipped() -> None:
    stock, idle = reports("interleave-2", False), reports("interleave-2", True, ())
    for s, p in zip(stock, idle, strict=True):
        assert any("no hooks installed" in line for line in p.log)
        assert not any("Applied" in line for line in p.log) and p.totals == ""
        for sr, pr in zip(s.results, p.results, strict=True):
            assert pr.gathered_rows == sr.gathered_rows and pr.decision == "{}"
            assert same_bits(pr.logits, sr.logits)


def test_a_cp_minimum_alone_installs_the_gate_but_not_the_tail() -> None:
    report = reports("interleave-2", True, (("CPKV_NSA_PREFILL_CP_MIN_TOKENS", "100"),))[0]
    assert applied(report.log) == {HookGroup.STARTUP, HookGroup.GATE}
    assert "phases on: none" in next(line for line in report.log if "plugin: hooks" in line)


@pytest.mark.parametrize(
    ("scenario", "stage", "error", "says"),
    [
        ("wrong-version", "load_plugins", "SystemExit", "sglang 0.5.23 is installed"),
        (
            "unresolved-target",
            "load_plugins",
            "SystemExit",
            "sglang.srt.layers.cp.utils.cp_gather_all_hidden_states (sglang/srt/layers/cp/utils.py",
        ),
        (
            "unlanded-wrapper",
            "publish",
            "Refused",
            "did not land at sglang.srt.model_executor.runner.eager_runner.cp_gather_after_forward",
        ),
        ("no-publish-hook", "first gate call", "Refused", "sglang.srt.runtime_context.publish"),
        ("bad-settings", "publish", "Refused", "SHADOW_RATE_OUT_OF_RANGE shadow_rate=2.0"),
    ],
)
def test_each_broken_start_stops_where_sglang_does_not_swallow_it(
    scenario: str, stage: str, error: str, says: str
) -> None:
    report = run_scenario(scenario)
    assert (report.stage, report.error) == (stage, error), report.message
    assert says in report.message and "cpkv plugin refuses to start" in report.message


def test_bad_settings_list_every_problem_with_its_fix() -> None:
    message = run_scenario("bad-settings").message
    assert "phase 4 is enabled (env:CPKV_ENABLE_NSA_PREFILL_CP_PAGE_ALIGNED_SPLIT)" in message
    assert "turn it off (cpkv disable 4)" in message
    assert "launch SGLang with --enable-kv-cache-sharding" in message


LEFT_BEHIND_WAIT_S = 60.0
"""How long an entry may stay after the job: a rank of a job running beside this one (the
other test worker) holds its folder until that job ends; a leak never lets it go."""


def _rank_entries() -> set[Path]:
    return {p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("cpkv-sglang-")}


def _left_behind(before: set[Path]) -> list[str]:
    deadline = time.monotonic() + LEFT_BEHIND_WAIT_S
    while (left := _rank_entries() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return sorted(p.name for p in left)


def test_rank_processes_leave_no_files_in_the_temp_folder() -> None:
    """A rank process exits without ``atexit``: its config file and model folder must go with
    the body, on a run and on a refused start alike."""
    before = _rank_entries()
    job = TailJob("interleave", (BatchShape((9, 4), (0, 0)),), plugin=True, settings=NARROW)
    assert len(run_ranks(2, job)) == 2
    assert refusals.run_scenario("bad-settings").stage == "publish"
    assert _left_behind(before) == []
