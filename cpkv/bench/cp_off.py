"""The ``cp_off`` figure of ``cpkv bench``: what per-batch CP off saves, and where it stops.

Two measurements, side by side:

- bytes: the trace (up to its last batch below the minimum: ``bytes_batches``) runs at
  every level twice on the bench's gloo group, every batch split
  (``cp_min_tokens`` 0 and SGLang's gate off, ``split-anyway``, so "on" means split) and
  with batches below the minimum unsplit (the ``none`` split); for
  each batch below the minimum, rank 0's bytes by purpose (current gather, tail,
  materialization) with CP on and off;
- time: batches of growing size run with CP on and CP off on a gloo group, round after round
  (on and off alternate, so drift hits both), at the highest level. The ratio on/off per
  size gives the break-even: the smallest size from which splitting is faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.bench.byte_model import one_head
from cpkv.run.jobs import LevelRun, RankJob
from cpkv_core.config import DeploymentConfig, ModelConfig, SplitGate
from cpkv_core.planning import BatchSpec, RequestSpec, pages_for_trace
from phases import PhaseId

CP_OFF_SIZES = (64, 128, 256, 512, 1024, 2048)
"""Batch sizes (current tokens) of the step-time comparison on the CPU."""
CP_OFF_SIZES_CUDA = (256, 512, 1024, 2048, 4096, 8192, 16384)
"""The same on CUDA, where the break-even is expected in the thousands of tokens."""
MAX_REQUEST_TOKENS = 1024
"""A timed batch of more tokens is cut into requests of at most this many (a chunk's shape)."""
ALWAYS_OFF = 1 << 62
"""A minimum no batch reaches: every batch runs unsplit."""


@dataclass(frozen=True, slots=True)
class CpOffBytes:
    """Rank 0's all-gathered bytes for one batch below the minimum, with CP on or off."""

    level: int
    batch: int
    tokens: int
    cp: str
    """``on``: the batch is split as usual; ``off``: the ``none`` split."""
    split: str
    phase: int
    current_gather: int
    """The current chunk's KV and index K all-gathered (for the write or the read)."""
    tail: int
    """Hidden states gathered at the tail."""
    materialize: int
    """History pages gathered into a full view."""

    @property
    def total(self) -> int:
        """Every byte the batch all-gathered on rank 0."""
        return self.current_gather + self.tail + self.materialize


@dataclass(frozen=True, slots=True)
class CpOffTime:
    """Step time of one batch size with CP on and off: the slowest rank, median of rounds."""

    tokens: int
    requests: int
    cp_on_seconds: float
    cp_off_seconds: float

    @property
    def ratio(self) -> float:
        """CP on over CP off: below 1 splitting is faster, above 1 CP off is."""
        return self.cp_on_seconds / self.cp_off_seconds


@dataclass(frozen=True, slots=True)
class CpOffFigure:
    """The ``cp_off`` figure."""

    min_tokens: int
    """The minimum of the bytes half: batches below it run unsplit."""
    cp_size: int
    bytes: list[CpOffBytes]
    times: list[CpOffTime]
    time_level: int
    """The level of the timed runs (the highest: every phase enabled)."""

    @property
    def break_even_tokens(self) -> int | None:
        """The smallest measured size from which CP on is faster at every larger size too;
        None when CP off is faster at the largest size measured."""
        even = None
        for row in reversed(self.times):
            if row.ratio >= 1.0:
                break
            even = row.tokens
        return even

    def to_json(self) -> dict[str, Any]:
        """The ``cp_off`` key of ``cpkv bench --json``."""
        return {
            "min_tokens": self.min_tokens,
            "cp_size": self.cp_size,
            "bytes": [asdict(row) | {"total": row.total} for row in self.bytes],
            "step_time": {
                "level": self.time_level,
                "backend": "gloo",
                "sizes": [asdict(row) | {"ratio_on_to_off": row.ratio} for row in self.times],
                "break_even_tokens": self.break_even_tokens,
            },
        }


def default_min_tokens(batches: Sequence[BatchSpec]) -> int:
    """The median batch size of ``batches``, rounded up: about half of them fall below."""
    sizes = [b.num_tokens for b in batches]
    return int(-(-statistics.median(sizes) // 1)) if sizes else 0


def _job(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    device: str,
    pages_of: Sequence[BatchSpec] | None = None,
) -> RankJob:
    """``batches`` at ``levels``, in a pool sized for ``pages_of`` (default: ``batches``)."""
    pages = pages_for_trace(pages_of or batches, deploy.page_size, deploy.cp_size)
    return RankJob(
        model, deploy, tuple(batches), tuple(levels), pages, frozenset(PhaseId), device=device
    )


def bytes_batches(batches: Sequence[BatchSpec], min_tokens: int) -> tuple[BatchSpec, ...]:
    """The trace up to its last batch below ``min_tokens`` (its first when none is): what the
    bytes half runs. A batch's bytes depend on the batches before it alone, and the pool is
    sized for the whole trace, so the bytes are those of the whole trace's run; the batches
    after (the built-in trace's two largest) would only be computed and dropped."""
    below = [i for i, batch in enumerate(batches) if batch.num_tokens < min_tokens]
    return tuple(batches[: (below[-1] if below else 0) + 1])


def _bytes_row(run: LevelRun, index: int, cp: str) -> CpOffBytes:
    step = run.steps[index]
    tags = run.rank_outputs[index][0].gathered_bytes
    return CpOffBytes(
        level=run.level,
        batch=step.scheduled.batch,
        tokens=step.scheduled.num_tokens,
        cp=cp,
        split=str(step.decision.plan.split),
        phase=step.decision.phase,
        current_gather=tags.get("current_kv", 0) + tags.get("current_index_k", 0),
        tail=tags.get("tail_hidden", 0),
        materialize=tags.get("materialize", 0),
    )


def cp_off_bytes_jobs(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    min_tokens: int,
    levels: Sequence[int] = tuple(range(len(PhaseId) + 1)),
    device: str = "cpu",
) -> list[RankJob]:
    """Every level of ``bytes_batches`` split, then with ``min_tokens``: two jobs, CP on
    then off (the bench runs them on its gloo group), on ``one_head(model)`` (they count
    bytes alone)."""
    model = one_head(model)
    deploy = deploy.model_copy(update={"split_gate": SplitGate.SPLIT_ANYWAY})
    measured = bytes_batches(batches, min_tokens)
    off_deploy = deploy.model_copy(update={"cp_min_tokens": min_tokens})
    return [
        _job(model, job_deploy, measured, levels, device, pages_of=batches)
        for job_deploy in (deploy, off_deploy)
    ]


def cp_off_bytes_rows(
    runs: Sequence[Sequence[LevelRun]], batches: Sequence[BatchSpec], min_tokens: int
) -> list[CpOffBytes]:
    """The rows of the batches below ``min_tokens``, CP on and off side by side, from the
    runs of ``cp_off_bytes_jobs``."""
    on, off = runs
    rows = []
    for run_on, run_off in zip(on, off, strict=True):
        for i, batch in enumerate(bytes_batches(batches, min_tokens)):
            if batch.num_tokens < min_tokens:
                rows += [_bytes_row(run_on, i, "on"), _bytes_row(run_off, i, "off")]
    return rows


def timed_batches(sizes: Sequence[int] = CP_OFF_SIZES) -> tuple[BatchSpec, ...]:
    """One batch of new requests per size, each request at most ``MAX_REQUEST_TOKENS``."""
    batches = []
    for i, tokens in enumerate(sizes):
        requests = -(-tokens // MAX_REQUEST_TOKENS)
        lens = [tokens // requests + (j < tokens % requests) for j in range(requests)]
        batches.append(
            BatchSpec(i, tuple(RequestSpec(f"t{i}-{j}", 0, n) for j, n in enumerate(lens)))
        )
    return tuple(batches)


def cp_off_time_jobs(
    model: ModelConfig,
    deploy: DeploymentConfig,
    repeats: int,
    level: int,
    device: str = "cpu",
) -> list[RankJob]:
    """``repeats + 1`` rounds (the first a warm-up) of a CP-on job then a CP-off job, each
    running every size once at ``level``; to run in the bench's one gloo group."""
    batches = timed_batches(CP_OFF_SIZES_CUDA if device == "cuda" else CP_OFF_SIZES)
    deploy = deploy.model_copy(update={"split_gate": SplitGate.SPLIT_ANYWAY})
    on = _job(model, deploy.model_copy(update={"cp_min_tokens": 0}), batches, (level,), device)
    off_deploy = deploy.model_copy(update={"cp_min_tokens": ALWAYS_OFF})
    off = _job(model, off_deploy, batches, (level,), device)
    return [job for _ in range(repeats + 1) for job in (on, off)]


def cp_off_times(jobs: Sequence[RankJob], runs: Sequence[list[LevelRun]]) -> list[CpOffTime]:
    """Per size: the median over the timed rounds of the slowest rank's seconds, CP on and
    off (``jobs`` and ``runs`` as :func:`cp_off_time_jobs` made and the group returned)."""
    batches = jobs[0].batches
    samples: dict[str, list[list[float]]] = {"on": [], "off": []}
    for index, (job, job_runs) in enumerate(zip(jobs, runs, strict=True)):
        if index < 2:
            continue  # NOTE: the warm-up round
        key = "on" if job.deploy.cp_min_tokens == 0 else "off"
        run = job_runs[0]
        samples[key].append([max(p.seconds for p in pieces) for pieces in run.rank_outputs])
    return [
        CpOffTime(
            tokens=batch.num_tokens,
            requests=len(batch.requests),
            cp_on_seconds=statistics.median(r[i] for r in samples["on"]),
            cp_off_seconds=statistics.median(r[i] for r in samples["off"]),
        )
        for i, batch in enumerate(batches)
    ]
