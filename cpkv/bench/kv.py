"""Sharded-KV figures for ``cpkv bench``: memory per rank, materialized bytes, slot vs unique
remap, and end-to-end step time per level, each measured side by side in one run."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from cpkv.bench.byte_model import one_head
from cpkv.bench.measure import ALL_PHASES
from cpkv.run.jobs import Backend, LevelRun, RankJob
from cpkv.run.loop import HostLoop
from cpkv.run.runner import run_levels
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist import Communicator, run_local
from cpkv_core.planning import (
    BatchSpec,
    KvLayout,
    KvReadStrategy,
    RequestSpec,
    build_host_plan,
    pages_for_trace,
)
from cpkv_core.runtime import (
    CPEngine,
    expand,
    kv_bytes_per_page,
    kv_bytes_per_token,
    materialize,
    upload,
)
from phases import PhaseId


@dataclass(frozen=True, slots=True)
class KvShare:
    """Persistent KV per rank after a trace: replicated (level 0) vs sharded (level 2)."""

    cp_size: int
    requests: int
    replicated_bytes: int
    sharded_bytes_by_rank: tuple[int, ...]
    page_bytes: int

    @property
    def max_fraction(self) -> float:
        """Largest rank's sharded bytes over the replicated bytes."""
        return max(self.sharded_bytes_by_rank) / self.replicated_bytes

    @property
    def within_target(self) -> bool:
        """Every rank holds at most ``1/cp_size`` of the replicated bytes plus one page per
        request."""
        bound = self.replicated_bytes / self.cp_size + self.requests * self.page_bytes
        return max(self.sharded_bytes_by_rank) <= bound


@dataclass(frozen=True, slots=True)
class MaterializedBytes:
    """Bytes one rank gathers to materialize views for one batch, at levels 2 and 3."""

    batch: int
    has_history: bool
    level2_bytes: int
    level3_bytes: int


@dataclass(frozen=True, slots=True)
class RemapCost:
    """View buffer bytes and plan + run time of one remap on one batch (rank 0)."""

    batch: str
    remap: str
    view_bytes: int
    microseconds: float


@dataclass(frozen=True, slots=True)
class StepTime:
    """End-to-end prefill time of a trace at one level on a gloo group, median of repeats."""

    level: int
    seconds: float
    ratio_to_level0: float


@dataclass(frozen=True, slots=True)
class PageBalance:
    """Pages each rank stores after the trace at one level (sharded levels only)."""

    level: int
    pages_by_rank: tuple[int, ...]
    """Pages in use that each rank's pool stores, rank 0 first."""

    @property
    def max_over_min(self) -> float:
        """Largest over smallest rank's pages (1.0 is perfect balance)."""
        return max(self.pages_by_rank) / max(1, min(self.pages_by_rank))


def _job(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    debug_checks: bool = False,
    device: str = "cpu",
) -> RankJob:
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    return RankJob(
        model,
        deploy,
        tuple(batches),
        tuple(levels),
        num_pages,
        ALL_PHASES,
        debug_checks=debug_checks,
        device=device,
    )


def kv_share_job(
    model: ModelConfig, batches: Sequence[BatchSpec], page_size: int, cp_size: int
) -> RankJob:
    """``batches`` at levels 0 and 2 on ``cp_size`` ranks, for ``kv_share_row``, on
    ``one_head(model)`` (it counts bytes alone)."""
    deploy = DeploymentConfig(cp_size=cp_size, page_size=page_size)
    return _job(one_head(model), deploy, batches, (0, 2))


def kv_share_row(job: RankJob, runs: Sequence[LevelRun]) -> KvShare:
    """Each rank's KV bytes after the last batch of ``kv_share_job``'s runs."""
    replicated, sharded = runs
    deploy = job.deploy
    return KvShare(
        cp_size=deploy.cp_size,
        requests=len({req.rid for batch in job.batches for req in batch.requests}),
        replicated_bytes=replicated.rank_outputs[-1][0].kv_bytes,
        sharded_bytes_by_rank=tuple(p.kv_bytes for p in sharded.rank_outputs[-1]),
        page_bytes=kv_bytes_per_page(job.model, deploy.index_k_dtype, deploy.page_size),
    )


def bench_kv_share(
    model: ModelConfig, batches: Sequence[BatchSpec], page_size: int, cp_sizes: Sequence[int]
) -> list[KvShare]:
    """Runs ``batches`` at levels 0 and 2 per CP size on the in-process group."""
    jobs = [kv_share_job(model, batches, page_size, cp) for cp in cp_sizes]
    return [kv_share_row(job, run_levels(job, Backend.LOCAL)) for job in jobs]


def materialized_bytes(
    runs: Sequence[LevelRun], batches: Sequence[BatchSpec]
) -> list[MaterializedBytes]:
    """From level-2 and level-3 runs of ``batches`` (rank 0's counts)."""
    level2, level3 = runs
    return [
        MaterializedBytes(
            batch.batch,
            batch.has_history,
            level2.rank_outputs[i][0].gathered_bytes.get("materialize", 0),
            level3.rank_outputs[i][0].gathered_bytes.get("materialize", 0),
        )
        for i, batch in enumerate(batches)
    ]


def remap_batches(
    requests: int = 8, history: int = 256, extend: int = 64
) -> dict[str, tuple[BatchSpec, BatchSpec]]:
    """(setup batch, measured batch) with and without a prefix shared by every request."""
    own = (
        BatchSpec(0, tuple(RequestSpec(f"s{i}", 0, history) for i in range(requests))),
        BatchSpec(1, tuple(RequestSpec(f"s{i}", history, extend) for i in range(requests))),
    )
    shared = (
        BatchSpec(0, (RequestSpec("src", 0, history),)),
        BatchSpec(
            1,
            tuple(
                RequestSpec(f"p{i}", history, extend, prefix_from="src") for i in range(requests)
            ),
        ),
    )
    return {"own history": own, "shared prefix": shared}


def _measure_remaps(
    comm: Communicator,
    model: ModelConfig,
    deploy: DeploymentConfig,
    setup: BatchSpec,
    measured: BatchSpec,
    repeats: int,
) -> list[tuple[str, int, float]]:
    """On one rank: writes ``setup`` sharded, then times plan + materialize of ``measured``
    under each remap; returns (remap, view bytes, median microseconds)."""
    num_pages = pages_for_trace([setup, measured], deploy.page_size, deploy.cp_size)
    loop = HostLoop(deploy, frozenset({PhaseId.SHARDED_KV}), num_pages)
    first, second = loop.step(setup), loop.step(measured)
    engine = CPEngine(model, deploy, comm, num_pages, KvLayout.SHARDED)
    engine.run_batch(first.scheduled, first.decision.plan)
    per_token = kv_bytes_per_token(model, deploy.index_k_dtype)
    strategies = (KvReadStrategy.MATERIALIZED_SLOT, KvReadStrategy.MATERIALIZED_UNIQUE)
    samples: dict[KvReadStrategy, list[float]] = {s: [] for s in strategies}
    view_tokens: dict[KvReadStrategy, int] = {}
    # NOTE: the two remaps alternate within each round so drift hits both alike.
    for _ in range(repeats + 3):
        for strategy in strategies:
            plan = dataclasses.replace(second.decision.plan, kv_read=strategy)
            start = time.perf_counter()
            host = build_host_plan(second.scheduled, plan, comm.rank)
            tensors = expand(host, upload(host, engine.device), model.vocab_size)
            materialize(comm, engine.pool.layers[0], tensors.send_pages, deploy.page_size)
            samples[strategy].append(time.perf_counter() - start)
            assert host.view is not None, "a view read plans a view"
            view_tokens[strategy] = host.view.view_tokens
    return [
        (str(s), view_tokens[s] * per_token, statistics.median(samples[s][3:]) * 1e6)
        for s in strategies
    ]


def bench_remaps(
    model: ModelConfig, cp_size: int = 2, page_size: int = 16, repeats: int = 20
) -> list[RemapCost]:
    """Slot vs unique remap on batches with and without a shared prefix, side by side: view
    buffer bytes (one layer) and plan + materialize time on rank 0 of an in-process group."""
    deploy = DeploymentConfig(cp_size=cp_size, page_size=page_size)
    rows = []
    for name, (setup, measured) in remap_batches().items():
        measure = partial(
            _measure_remaps,
            model=model,
            deploy=deploy,
            setup=setup,
            measured=measured,
            repeats=repeats,
        )
        for remap, view_bytes, micros in run_local(cp_size, measure)[0]:
            rows.append(RemapCost(name, remap, view_bytes, micros))
    return rows


def _trace_seconds(run: LevelRun) -> float:
    """A trace's time: per batch the slowest rank, summed."""
    return sum(max(p.seconds for p in pieces) for pieces in run.rank_outputs)


WARM_UP_BATCHES = 2
"""Batches of the trace every level runs once before the timed rounds (``step_time_jobs``)."""


def step_time_jobs(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    repeats: int,
    debug_checks: bool = False,
    device: str = "cpu",
) -> list[RankJob]:
    """A warm-up, every level once on the trace's first ``WARM_UP_BATCHES`` batches; then
    ``repeats`` rounds of every level, interleaved; for the bench's one gloo group
    (``run_jobs_on_gloo``)."""
    warm = _job(model, deploy, batches[:WARM_UP_BATCHES], levels, debug_checks, device)
    timed = _job(model, deploy, batches, tuple(levels) * repeats, debug_checks, device)
    return [warm, timed]


def step_times(
    levels: Sequence[int], repeats: int, runs: Sequence[LevelRun]
) -> tuple[list[StepTime], list[LevelRun]]:
    """The times of the timed job of :func:`step_time_jobs` (its ``runs``), and the last
    round's runs."""
    per_level = {
        level: statistics.median(_trace_seconds(runs[r * len(levels) + i]) for r in range(repeats))
        for i, level in enumerate(levels)
    }
    base = per_level[levels[0]]
    times = [StepTime(level, s, s / base) for level, s in per_level.items()]
    return times, list(runs[-len(levels) :])


def page_balance(runs: Sequence[LevelRun], page_bytes: int) -> list[PageBalance]:
    """From the sharded levels' last batch: per-rank KV bytes over one page's bytes."""
    return [
        PageBalance(run.level, tuple(p.kv_bytes // page_bytes for p in run.rank_outputs[-1]))
        for run in runs
        if run.steps and run.steps[0].decision.plan.kv_layout is KvLayout.SHARDED
    ]
