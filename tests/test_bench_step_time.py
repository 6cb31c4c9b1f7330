"""The step-time figure read off a gloo run's timed job (``bench.kv.step_times``): the rounds
of every level run interleaved (``levels x repeats``), each trace's time the slowest rank of
each batch summed, and each level's median over its own rounds."""

from __future__ import annotations

import torch

from cpkv.bench.kv import StepTime, step_times
from cpkv.run.jobs import LevelRun
from cpkv_core.runtime import RankBatchOutput

LEVELS = (0, 2, 5)
REPEATS = 3


def piece(batch: int, rank: int, seconds: float) -> RankBatchOutput:
    """One rank's output of one batch that took ``seconds`` (no tensors are read)."""
    empty = torch.empty(0)
    return RankBatchOutput(batch, rank, empty, empty, empty, empty, {}, 0, seconds)


def level_run(level: int, batch_seconds: list[tuple[float, float]]) -> LevelRun:
    """A level's run of two ranks whose batch ``b`` took ``batch_seconds[b]`` on each."""
    outputs = tuple(
        tuple(piece(b, rank, s) for rank, s in enumerate(pair))
        for b, pair in enumerate(batch_seconds)
    )
    return LevelRun(level, (), (), outputs)


def test_each_level_takes_the_median_of_its_own_interleaved_rounds() -> None:
    """Round ``r`` of level index ``i`` takes ``i + 1 + r / 10`` s on its slower rank, over
    two batches (the faster rank's time never counts): the medians are ``i + 1.1``."""
    runs = [
        level_run(level, [((i + 1 + r / 10) / 2, 0.01), (0.02, (i + 1 + r / 10) / 2)])
        for r in range(REPEATS)
        for i, level in enumerate(LEVELS)
    ]
    times, last = step_times(LEVELS, REPEATS, runs)
    expected = [1.1, 2.1, 3.1]
    assert [t.level for t in times] == list(LEVELS)
    for step, seconds in zip(times, expected, strict=True):
        assert step == StepTime(step.level, step.seconds, step.seconds / times[0].seconds)
        assert abs(step.seconds - seconds) < 1e-12, (step.level, step.seconds)
    assert [id(run) for run in last] == [id(run) for run in runs[-len(LEVELS) :]]
