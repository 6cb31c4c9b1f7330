"""How ``cpkv bench --rows`` times an op against its copy: warmed up, then round by round, the
op and then the copy of its bytes (op, copy, op, copy ...), on one clock.

- **The clock** (``op_clock``). On the CPU with one torch thread (the default) both run on
  the calling thread, timed on its CPU time (``thread-cpu``): the time other processes hold
  the core is in neither, and what slows the core in one round (another process's cache
  traffic, a frequency change) slows that round's op and copy alike. With more threads,
  the wall clock (``wall``). On CUDA, events recorded around each op and each copy
  (``cuda-events``), every round queued without a host sync; the host waits once after the
  first round (its time sets the number of rounds) and once after the last.
- **Rounds.** At least ``repeats``, more for a short op, up to ``MAX_REPEATS`` or about
  ``ROUND_BUDGET_S`` of rounds on the clock (as many rounds on a loaded machine as on an
  idle one). On the CPU a round whose op faulted fresh memory in
  (``measure.faulted``) is set aside and run again, up to as many extra rounds as were
  asked for: it timed glibc's placement, which a device's caching allocator does not do.
- **Figures** (``Timing``): the ratio of the copy's median round to the op's, and its spread,
  the lowest and highest ratio within one round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from cpkv.bench.rows.ceiling import CopyCeiling
from cpkv.bench.rows.measure import Clock, faulted, minor_faults, sync
from cpkv.bench.rows.timing import Timing

__all__ = [
    "MAX_REPEATS",
    "MAX_WARMUPS",
    "ROUND_BUDGET_S",
    "SETTLED_CALLS",
    "event_rounds",
    "op_clock",
    "time_op",
    "warm_up",
]

MAX_REPEATS = 25
"""Most timed rounds of one op (a short op gets more rounds, up to this)."""
ROUND_BUDGET_S = 0.15
"""A short op is repeated until its rounds take about this long."""
MAX_WARMUPS = 16
"""Most warm-up calls of an op before it is timed."""
SETTLED_CALLS = 3
"""Calls in a row without page faults that end an op's warm-up."""

Run = Callable[[], object]


class Event(Protocol):
    """What a round needs of a device event (``torch.cuda.Event(enable_timing=True)``)."""

    def record(self) -> None:
        """Marks the point the device's queue has reached."""

    def elapsed_time(self, end: Any, /) -> float:
        """Milliseconds from this event to ``end`` (both completed)."""


def op_clock(device: torch.device) -> tuple[str, Clock]:
    """The clock an op's rounds are timed on, and its name (module docstring): ``cuda-events``
    on CUDA (the clock returned is unused there), ``thread-cpu`` on the CPU with one torch
    thread, else ``wall``."""
    if device.type == "cuda":
        return "cuda-events", time.perf_counter
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return "thread-cpu", time.thread_time
    return "wall", time.perf_counter


def warm_up(run: Run, nbytes: int, device: torch.device) -> None:
    """Calls ``run`` until ``SETTLED_CALLS`` calls in a row take no page faults (at most
    ``MAX_WARMUPS`` calls; one on a device, whose caching allocator holds its blocks).

    On the CPU a call faults in the memory its temporaries take when glibc places them past
    what the heap has touched. glibc's best fit does so for several calls after an op's
    sizes first appear, and can place one call in held memory and the next in fresh memory
    again (``measure``); a call without faults alone does not show that the op has
    settled.
    """
    if device.type != "cpu":
        run()
        sync(device)
        return
    settled = 0
    for _ in range(MAX_WARMUPS):
        before = minor_faults()
        run()
        settled = 0 if faulted(minor_faults() - before, nbytes, device) else settled + 1
        if settled == SETTLED_CALLS:
            return


def _round_count(repeats: int, round_seconds: float) -> int:
    """Rounds to time after a first round of ``round_seconds`` (op and copy)."""
    return max(repeats, min(MAX_REPEATS, int(ROUND_BUDGET_S / max(round_seconds, 1e-9))))


def event_rounds(
    run: Run, copy: Run, rounds: int, new_event: Callable[[], Event], wait: Callable[[], None]
) -> list[tuple[float, float]]:
    """``(op seconds, copy seconds)`` of ``rounds`` rounds timed by device events: each
    round records an event, queues the op, records one, queues the copy, records one; no
    round waits for the device. ``wait`` (a device sync) runs once, after the last round."""
    marks = []
    for _ in range(rounds):
        start, between, end = new_event(), new_event(), new_event()
        start.record()
        run()
        between.record()
        copy()
        end.record()
        marks.append((start, between, end))
    wait()
    return [(s.elapsed_time(b) / 1e3, b.elapsed_time(e) / 1e3) for s, b, e in marks]


def _cuda_timing(run: Run, copy: Run, repeats: int, device: torch.device) -> Timing:
    """Event-timed rounds on CUDA (module docstring)."""

    def new_event() -> Event:
        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def wait() -> None:
        torch.cuda.synchronize(device)

    first = event_rounds(run, copy, 1, new_event, wait)
    rest = event_rounds(run, copy, _round_count(repeats, sum(first[0])) - 1, new_event, wait)
    pairs = first + rest
    return Timing(tuple(op for op, _ in pairs), tuple(c for _, c in pairs))


def _timed(run: Run, clock: Clock) -> tuple[float, float]:
    """``(seconds on clock, wall seconds)`` of one call of ``run`` (on the CPU)."""
    wall, began = time.perf_counter(), clock()
    run()
    return clock() - began, time.perf_counter() - wall


Round = tuple[tuple[float, float], tuple[float, float]]
"""``((op on the clock, op wall), (copy on the clock, copy wall))``."""


def _cpu_timing(
    run: Run, copy: Run, nbytes: int, repeats: int, device: torch.device, clock: Clock
) -> Timing:
    """Rounds on the CPU, faulted ones set aside (module docstring)."""
    clean: list[Round] = []
    set_aside: list[Round] = []
    faults = 0
    rounds = repeats
    while len(clean) < rounds and len(set_aside) < rounds:
        before = minor_faults()
        op = _timed(run, clock)
        round_faults = minor_faults() - before
        faults += round_faults
        pair = (op, _timed(copy, clock))
        (set_aside if faulted(round_faults, nbytes, device) else clean).append(pair)
        if len(clean) + len(set_aside) == 1:
            # NOTE: on the run's clock, so a loaded machine's run takes as many rounds.
            rounds = _round_count(repeats, op[0] + pair[1][0])
    used = clean if len(clean) == rounds else clean + set_aside
    return Timing(
        op_rounds=tuple(o[0] for o, _ in used),
        copy_rounds=tuple(c[0] for _, c in used),
        op_wall_rounds=tuple(o[1] for o, _ in used),
        copy_wall_rounds=tuple(c[1] for _, c in used),
        page_faults=faults,
        faulted_rounds=len(set_aside) if used is clean else 0,
    )


def time_op(
    run: Run,
    nbytes: int,
    ceiling: CopyCeiling,
    repeats: int,
    device: torch.device,
    clock: Clock = time.perf_counter,
) -> Timing:
    """Times ``run`` and ``ceiling.copy(nbytes)`` round by round after warming ``run`` up
    (``warm_up``) and calling the copy once: at least ``repeats`` rounds, more for a short
    op. On CUDA by events (``clock`` unused), elsewhere on ``clock`` (module docstring).

    The medians are over the fault-free rounds when there are enough of them, else over
    every round; ``Timing.faulted_rounds`` says how many were set aside.
    """

    def copy() -> None:
        ceiling.copy(nbytes)

    warm_up(run, nbytes, device)
    # NOTE: one call: the ceiling's buffers are made and touched once, so it never faults.
    copy()
    sync(device)
    if device.type == "cuda":
        return _cuda_timing(run, copy, repeats, device)
    return _cpu_timing(run, copy, nbytes, repeats, device, clock)
