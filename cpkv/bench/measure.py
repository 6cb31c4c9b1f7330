"""What the figures of ``cpkv bench`` measure with: the median of timed runs after a warm-up,
a synthetic first batch, and every phase enabled."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from cpkv_core.planning import BatchSpec, RequestSpec
from phases import PhaseId

ALL_PHASES = frozenset(PhaseId)
"""Level L of a bench enables every phase <= L."""


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def synthetic_batch(bs: int, extend_len: int) -> BatchSpec:
    """A first batch of ``bs`` new requests of ``extend_len`` tokens each."""
    return BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, extend_len) for i in range(bs)))
