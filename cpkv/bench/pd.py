"""PD figure for ``cpkv bench``: bytes each prefill rank sends, and the send path's
throughput as a ratio to one large-buffer write over the same Mooncake loopback, to a non-CP
decode server and, at the top level, re-sharded to decode groups of M = N and M != N ranks.

Measured on the bench's model widened to DeepSeek-V3.2's KV rows (``pd_model``): what limits
a write is its size, and the size of a rank's write is set by the bytes of a token row. Next
to the send path, every rank writes its share in one call at once (the ceiling): the same
throughput statistic for the best sender this transport allows at this CP size here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

from cpkv.bench.byte_model import one_head
from cpkv.bench.pd_figure import MIB, PdBytes, PdFigure
from cpkv.run.jobs import LevelRun, RankJob
from cpkv.run.pd import PdJob, pd_session
from cpkv.run.runner import run_jobs_on_gloo
from cpkv_core.config import DeploymentConfig, ModelConfig, model_preset
from cpkv_core.pd import ConcurrentWrite, WriteStats
from cpkv_core.planning import BatchSpec, RequestSpec
from cpkv_core.runtime import kv_bytes_per_page

ROWS_OF = "deepseek-v3.2"
"""The model whose KV row widths the PD figure uses."""


def pd_model(model: ModelConfig, rows_of: str = ROWS_OF) -> ModelConfig:
    """``model`` with the latent, rope and index-key widths of ``rows_of``, one query head
    and one indexer head (``byte_model.one_head``): the same layers, a real model's bytes
    per token row per layer.

    The heads change no byte the figure counts; one of each makes the ranks' compute between
    the sends about a quarter of the tiny model's four (the PD section took 88 s with four,
    49 s with one, on a 2-core 2 GHz EPYC, the same bytes to the byte)."""
    real = model_preset(rows_of)
    widened = model.model_copy(
        update={
            "name": f"{model.name}-{rows_of}-rows",
            "kv_lora_rank": real.kv_lora_rank,
            "qk_rope_head_dim": real.qk_rope_head_dim,
            "index_head_dim": real.index_head_dim,
        }
    )
    return one_head(widened).model_copy(update={"name": widened.name})


def median_flush_mib_per_second(stats: Sequence[WriteStats]) -> float:
    """Median over the flushes of every rank of bytes over seconds."""
    rates = [
        nbytes / max(1e-9, end - start) / MIB
        for s in stats
        for nbytes, (start, end) in zip(s.flush_bytes, s.spans, strict=True)
        if nbytes
    ]
    return statistics.median(rates) if rates else 0.0


def union_seconds(spans: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def concurrent_seconds(writes: Sequence[ConcurrentWrite]) -> tuple[float, float]:
    """(median over repeats of the ranks' summed write times, median over repeats of the
    time any rank was writing) of the group's concurrent writes."""
    rounds = list(zip(*(w.spans for w in writes), strict=True))
    summed = [sum(end - start for start, end in spans) for spans in rounds]
    union = [union_seconds(spans) for spans in rounds]
    return statistics.median(summed), statistics.median(union)


def other_decode_cp_size(cp_size: int) -> int:
    """The decode CP size the figure pairs with ``cp_size`` prefill ranks for M != N: 2, or
    4 when the prefill runs 2."""
    return 4 if cp_size == 2 else 2


def _row(level: int, run: LevelRun, decode_cp_size: int) -> PdBytes:
    """One level's send path and the baselines timed after it."""
    probe = run.pd_probe
    assert probe is not None and run.pd_concurrent, "the ranks timed no large writes"
    summed, group = concurrent_seconds(run.pd_concurrent)
    return PdBytes(
        level,
        tuple(sum(s.bytes_sent for s in results) for results in run.pd),
        tuple(stats.seconds for stats in run.pd_stats),
        tuple(stats.exposed_seconds for stats in run.pd_stats),
        tuple(stats.calls for stats in run.pd_stats),
        union_seconds([span for stats in run.pd_stats for span in stats.spans]),
        probe.nbytes,
        probe.seconds,
        median_flush_mib_per_second(run.pd_stats),
        sum(w.nbytes for w in run.pd_concurrent),
        summed,
        group,
        tuple(stats.descriptors for stats in run.pd_stats),
        tuple(
            tuple(sum(s.bytes_by_dest[d] for s in results) for d in range(decode_cp_size))
            for results in run.pd
        ),
        decode_cp_size,
    )


def warm_up_trace(deploy: DeploymentConfig) -> tuple[BatchSpec, ...]:
    """One batch of one request whose pages reach every prefill owner and every decode
    rank: a job's warm-up, which opens the transfer sessions of its prefill and decode
    ranks and starts their writers (a run of the whole trace did no more)."""
    # NOTE: 2 x cp segments of dcp pages: under the page-aligned zigzag each rank computes
    # (and owns) two segments, each reaching every decode rank (page p is rank p % dcp's).
    pages = 2 * deploy.cp_size * max(1, deploy.decode_cp_size)
    return (BatchSpec(0, (RequestSpec("warm-up", 0, pages * deploy.page_size),)),)


def pd_jobs(
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    overlap: bool = True,
) -> list[PdJob]:
    """The figure's jobs, each after its warm-up job: ``levels`` to one decode process,
    then the last level to a decode group of ``cp_size`` and of ``other_decode_cp_size``
    ranks (``bench_pd``)."""
    top = levels[-1]
    deploys = [deploy] + [
        deploy.model_copy(update={"decode_cp_size": size})
        for size in (deploy.cp_size, other_decode_cp_size(deploy.cp_size))
    ]
    measured = [tuple(levels), (top,), (top,)]
    jobs = []
    for job_deploy, job_levels in zip(deploys, measured, strict=True):
        warm = warm_up_trace(job_deploy)
        jobs.append(PdJob(job_deploy, warm, job_levels[:1], overlap=overlap))
        jobs.append(PdJob(job_deploy, tuple(batches), job_levels, probe=True, overlap=overlap))
    return jobs


def unacknowledged(runs: Sequence[Sequence[LevelRun]]) -> list[str]:
    """Every request of ``runs`` that a prefill rank saw no decode rank complete (the
    figure's check: ``cpkv pd`` and the tests check the rebuilt KV against the reference)."""
    return [
        f"{result.rid} from rank {result.rank}: {'; '.join(result.errors) or 'not ready'}"
        for job_runs in runs
        for run in job_runs
        for results in run.pd
        for result in results
        if not result.ready
    ]


def pd_figure(
    model: ModelConfig, deploy: DeploymentConfig, levels: Sequence[int], runs: list[list[LevelRun]]
) -> PdFigure:
    """The figure from the runs of ``pd_jobs`` (``model``: the one measured, ``pd_model``)."""
    failed = unacknowledged(runs)
    if failed:
        raise RuntimeError(f"PD transfer failed in the bench: {failed}")
    top = levels[-1]
    sizes = (deploy.cp_size, other_decode_cp_size(deploy.cp_size))
    rows = tuple(_row(level, run, 1) for level, run in zip(levels, runs[1], strict=True))
    reshard = (
        rows[-1],
        *(_row(top, runs[job][0], size) for job, size in zip((3, 5), sizes, strict=True)),
    )
    token_bytes = kv_bytes_per_page(model, deploy.index_k_dtype, 1)
    return PdFigure(rows, model.name, token_bytes, reshard)


class PdPart:
    """The PD figure as a part of a larger gloo group (``suite.run_bench``): its decode
    groups start on a thread of their own as soon as it is made, so their processes start
    while the bench runs other work; ``jobs`` waits for them and gives the prefill jobs,
    ``finish`` stops the groups and makes the figure, ``close`` stops them whatever
    happened."""

    def __init__(
        self,
        model: ModelConfig,
        deploy: DeploymentConfig,
        batches: Sequence[BatchSpec],
        levels: Sequence[int],
        overlap: bool = True,
    ) -> None:
        self.measured = pd_model(model)
        self.deploy = deploy
        self.levels = tuple(levels)
        self._stack = ExitStack()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cpkv-pd-start")
        session = pd_session(self.measured, pd_jobs(deploy, batches, levels, overlap))
        self._started = self._pool.submit(self._stack.enter_context, session)

    def jobs(self) -> list[RankJob]:
        """The prefill jobs, once every decode group listens."""
        return self._started.result().rank_jobs

    def finish(self, runs: list[list[LevelRun]]) -> PdFigure:
        """Stops the decode groups; the figure from the runs of ``jobs``."""
        self.close()
        return pd_figure(self.measured, self.deploy, self.levels, runs)

    def close(self) -> None:
        """Waits for the decode groups' start to end, then stops them (again: a no-op)."""
        self._started.exception()  # NOTE: a failed start stopped what it had started
        self._stack.close()
        self._pool.shutdown()


def bench_pd(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    overlap: bool = True,
) -> PdFigure:
    """Prefills ``batches`` at ``levels`` on ``pd_model(model)``, streaming every request to
    one decode process; after each level, rank 0 times one write of that level's KV bytes to
    the same server, then every rank writes its share in one call at once. Then the last
    level again, re-sharded to a decode group of ``cp_size`` ranks and one of
    ``other_decode_cp_size`` ranks (the large write goes to decode rank 0).

    Each job follows a warm-up job (``warm_up_trace``) on its decode group, which is not
    counted. ``overlap`` False makes the ranks write synchronously (``PdJob.overlap``).
    """
    part = PdPart(model, deploy, batches, levels, overlap)
    try:
        return part.finish(run_jobs_on_gloo(part.jobs()))
    finally:
        part.close()
