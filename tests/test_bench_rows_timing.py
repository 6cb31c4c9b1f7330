"""``cpkv bench --rows``' figures from rounds: ``ratio_to_copy`` is the copy's median round over
the op's median round, its spread the lowest and highest ratio within one round, and the
goal's verdict reads it; on CUDA the rounds are timed by events with no host sync inside a
round. The timings here are built by hand (no timing is asserted); the CUDA path runs with
stand-in events on the CPU (no GPU here), to show what it queues and when it waits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rich.console import Console

from cpkv.bench.rows import rounds as rows_rounds
from cpkv.bench.rows.figures import RowsEntry
from cpkv.bench.rows.run import GOAL_RATIO, RowsReport, pooled_passes
from cpkv.bench.rows.setup import RowsGrid
from cpkv.bench.rows.timing import CLOCK_FLOOR_S, NOISY_SPREAD, Timing
from cpkv.render.rows import _heading, _ops_table

GRID = RowsGrid("hand", (1024, 4096), 2048, (1,), (2,))


def entry(op: str, history: int, timing: Timing) -> RowsEntry:
    return RowsEntry(
        op=op,
        variant="v",
        history=history,
        cp_size=2,
        bs=1,
        shared_prefix=False,
        per="layer",
        levels=(2,),
        bytes=1 << 20,
        timing=timing,
        scratch_bytes=0,
        planned_scratch_bytes=None,
        budget="-",
        plan_seconds=None,
    )


def report(entries: list[RowsEntry]) -> RowsReport:
    return RowsReport(
        "hand", "bf16", 1284, 14336, 61, GRID, "cpu", "caching", 1, "thread-cpu", 1.0, entries, []
    )


SLOW_MEDIAN = Timing((0.010, 0.025, 0.030), (0.010, 0.010, 0.010))
"""Fastest op round 10 ms, median 25 ms, the copy 10 ms each round: 0.4 (under the goal);
the fastest op round would make it 1.0."""
SLOW_COPY = Timing((0.010, 0.010, 0.010), (0.002, 0.006, 0.007))
"""The op 10 ms each round, the copy's median 6 ms, its fastest 2 ms: 0.6 (over the goal);
the fastest copy would make it 0.2."""
SHORT = Timing((0.010, 0.010, 0.010), (0.003, 0.003, 0.003))
"""0.3, at the shorter history: not the goal's."""


def test_ratio_to_copy_is_the_median_copy_over_the_median_op() -> None:
    under, over = entry("a", 4096, SLOW_MEDIAN), entry("b", 4096, SLOW_COPY)
    assert under.ratio_to_copy == pytest.approx(0.4)
    assert over.ratio_to_copy == pytest.approx(0.6)
    assert under.ratio_to_copy_best == pytest.approx(1.0)  # fastest over fastest, apart
    doc = under.to_json()
    assert (doc["seconds"], doc["copy_seconds"], doc["rounds"]) == (0.025, 0.010, 3)
    assert doc["ratio_to_copy"] == pytest.approx(0.4)
    assert (doc["ratio_low"], doc["ratio_high"]) == pytest.approx((1 / 3, 1.0))
    assert doc["op_rounds"] == [0.010, 0.025, 0.030] and doc["noisy"] is True


def test_below_goal_takes_the_longest_history_under_the_goal_by_the_medians() -> None:
    entries = [entry("a", 4096, SLOW_MEDIAN), entry("b", 4096, SLOW_COPY), entry("c", 1024, SHORT)]
    assert GOAL_RATIO == 0.5
    assert [e.op for e in report(entries).below_goal] == ["a"]


@pytest.mark.parametrize(
    ("copies", "noisy"),
    [((0.7, 0.8, 0.9), False), ((0.5, 0.8, 1.0), True), ((0.8, 0.8, 0.8), False)],
)
def test_an_entry_is_noisy_when_its_rounds_disagree(copies: tuple[float, ...], noisy: bool) -> None:
    """Ratio 0.8 each time: a spread of 0.2, 0.5 and 0 against a bound of 0.4."""
    timing = Timing((1.0, 1.0, 1.0), copies)
    assert pytest.approx(0.4) == NOISY_SPREAD * 0.8
    assert timing.noisy is noisy


def test_pooled_timings_read_every_round_of_every_pass() -> None:
    """Two instances of an op's buffers: 0.8 of the copy at one, 0.4 at the other. The pooled
    timing's ratio and spread are over all six rounds; one instance's spread would hide the
    other's."""
    fast = Timing((1.0, 1.0, 1.0), (0.8, 0.8, 0.8), op_wall_rounds=(1.0,) * 3, page_faults=2)
    slow = Timing((2.0, 2.0, 2.0), (0.8, 0.8, 0.8), op_wall_rounds=(3.0,) * 3, faulted_rounds=1)
    pooled = Timing.pooled([fast, slow])
    assert (pooled.rounds, pooled.placements, pooled.placement_rounds) == (6, 2, (3, 3))
    again = Timing.pooled([pooled, Timing((4.0,), (0.8,))])
    assert (again.placements, again.placement_rounds) == (3, (3, 3, 1))
    assert pooled.op_rounds == (1.0, 1.0, 1.0, 2.0, 2.0, 2.0)
    assert (pooled.ratio_low, pooled.ratio_high) == pytest.approx((0.4, 0.8))
    assert pooled.ratio == pytest.approx(0.8 / 1.5)  # the medians of all six rounds
    assert (pooled.wall_seconds, pooled.copy_wall_seconds) == (2.0, None)
    assert (pooled.page_faults, pooled.faulted_rounds) == (2, 1)
    with pytest.raises(ValueError, match="at least one"):
        Timing.pooled([])


def test_passes_pool_one_op_at_one_point_and_refuse_to_mix_two() -> None:
    fast = Timing((1.0,), (0.8,))
    slow = Timing((2.0,), (0.8,))
    pooled = pooled_passes([[entry("a", 4096, fast)], [entry("a", 4096, slow)]])
    assert [e.timing.op_rounds for e in pooled] == [(1.0, 2.0)]
    assert pooled[0].ratio_to_copy == pytest.approx(0.8 / 1.5)
    with pytest.raises(RuntimeError, match="passes over the grid disagree"):
        pooled_passes([[entry("a", 4096, fast)], [entry("a", 1024, slow)]])


def test_a_round_the_clock_did_not_see_pass_gives_a_ratio_not_an_error() -> None:
    """An op round of 0 s (a short op next to ``yes``, once): every figure is finite."""
    zero = entry("a", 4096, Timing((0.0, 1e-4, 1e-4), (5e-5, 5e-5, 5e-5)))
    doc = zero.to_json()
    assert doc["ratio_to_copy"] == pytest.approx(0.5)
    assert (doc["placements"], doc["placement_rounds"]) == (1, [3])
    assert doc["ratio_to_copy_best"] == pytest.approx(5e-5 / CLOCK_FLOOR_S)
    assert doc["ratio_high"] == pytest.approx(5e-5 / CLOCK_FLOOR_S) and doc["noisy"] is True


@pytest.mark.parametrize("placement_rounds", [(1, 1), (2, 2), (3, 0)])
def test_placement_rounds_split_the_rounds_into_instances(
    placement_rounds: tuple[int, ...],
) -> None:
    with pytest.raises(ValueError, match="do not split the 3 rounds"):
        Timing((1.0,) * 3, (0.8,) * 3, placement_rounds=placement_rounds)
    assert Timing((1.0,) * 3, (0.8,) * 3, placement_rounds=(2, 1)).placements == 2
    assert Timing((1.0,) * 3, (0.8,) * 3).placements == 1


def test_a_timing_needs_a_copy_round_for_every_op_round() -> None:
    with pytest.raises(ValueError, match="as many copy rounds as op rounds"):
        Timing((1.0, 1.0), (1.0,))


def test_the_text_table_prints_the_spread_beside_the_ratio() -> None:
    console = Console(record=True, width=200)
    console.print(_ops_table(report([entry("a", 4096, SLOW_MEDIAN)]), 4096))
    text = console.export_text()
    assert "spread" in text and "0.40" in text and "0.33-1.00 noisy" in text


@pytest.mark.parametrize(
    ("buffers", "cache", "said"),
    [
        (480 << 20, 480 << 20, "two buffers of 480.0 MiB (last-level cache: 480.0 MiB)"),
        (64 << 20, 32 << 20, "two buffers of 64.0 MiB (last-level cache: 32.0 MiB)"),
        (64 << 20, 0, "two buffers of 64.0 MiB (last-level cache: not known)"),
    ],
)
def test_the_heading_says_what_the_copy_runs_past(buffers: int, cache: int, said: str) -> None:
    hand = dataclasses.replace(
        report([entry("a", 4096, SLOW_MEDIAN)]),
        copy_buffer_bytes=buffers,
        last_level_cache_bytes=cache,
    )
    assert said in _heading(hand)


class StandInEvent:
    """Records the step it was recorded at in a shared log; times are steps in ms."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.at = -1

    def record(self) -> None:
        self.at = len(self.log)
        self.log.append("event")

    def elapsed_time(self, end: StandInEvent, /) -> float:
        assert "wait" in self.log, "an event's time was read before the device was waited for"
        return float(end.at - self.at)


def test_cuda_rounds_queue_op_and_copy_in_turn_and_wait_once_after_the_last() -> None:
    log: list[str] = []
    pairs = rows_rounds.event_rounds(
        lambda: log.append("op"),
        lambda: log.append("copy"),
        3,
        lambda: StandInEvent(log),
        lambda: log.append("wait"),
    )
    assert log == ["event", "op", "event", "copy", "event"] * 3 + ["wait"]
    assert pairs == [(2e-3, 2e-3)] * 3


def test_the_device_picks_the_clock() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert rows_rounds.op_clock(torch.device("cpu"))[0] == "thread-cpu"
        assert rows_rounds.op_clock(torch.device("cuda"))[0] == "cuda-events"
        torch.set_num_threads(2)
        assert rows_rounds.op_clock(torch.device("cpu"))[0] == "wall"
    finally:
        torch.set_num_threads(threads)


class StandInCeiling:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def copy(self, nbytes: int) -> None:
        self.log.append("copy")


def test_time_op_on_cuda_takes_the_event_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the CUDA calls stood in for: one warm-up call each, then the rounds, the host
    waiting only after the warm-ups, the first round and the last."""
    log: list[str] = []
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing: StandInEvent(log))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("wait"))
    monkeypatch.setattr(rows_rounds, "ROUND_BUDGET_S", 0.0)
    ceiling = StandInCeiling(log)
    timing = rows_rounds.time_op(
        lambda: log.append("op"),
        1 << 20,
        ceiling,
        3,
        torch.device("cuda"),  # type: ignore[arg-type]
    )
    round_ = ["event", "op", "event", "copy", "event"]
    assert log == ["op", "wait", "copy", "wait", *round_, "wait", *round_ * 2, "wait"]
    assert timing.rounds == 3 and timing.wall_seconds is None


@pytest.mark.parametrize(
    ("round_seconds", "rounds"),
    [
        (1.0, 3),  # a long op: the rounds asked for
        (rows_rounds.ROUND_BUDGET_S / 10.5, 10),  # a short one: rounds to fill the budget
        (1e-7, rows_rounds.MAX_REPEATS),  # a tiny one: no more than the cap
        (0.0, rows_rounds.MAX_REPEATS),  # a round the clock read as 0 s
    ],
)
def test_a_short_op_takes_rounds_to_fill_the_budget_up_to_the_cap(
    round_seconds: float, rounds: int
) -> None:
    assert rows_rounds._round_count(3, round_seconds) == rounds
