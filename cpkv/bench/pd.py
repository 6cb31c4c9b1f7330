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

from cpkv.bench.pd_figure import MIB, PdBytes, PdFigure
from cpkv.run.jobs import LevelRun
from cpkv.run.pd import PdJob, run_pd
from cpkv_core.config import DeploymentConfig, ModelConfig, model_preset
from cpkv_core.pd import ConcurrentWrite, WriteStats
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import kv_bytes_per_page

ROWS_OF = "deepseek-v3.2"
"""The model whose KV row widths the PD figure uses."""


def pd_model(model: ModelConfig, rows_of: str = ROWS_OF) -> ModelConfig:
    """``model`` with the latent, rope and index-key widths of ``rows_of``: the same layers
    and compute, a real model's bytes per token row per layer."""
    real = model_preset(rows_of)
    return model.model_copy(
        update={
            "name": f"{model.name}-{rows_of}-rows",
            "kv_lora_rank": real.kv_lora_rank,
            "qk_rope_head_dim": real.qk_rope_head_dim,
            "index_head_dim": real.index_head_dim,
        }
    )


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

    A first run of each job is a warm-up (it opens the transfer sessions) and is not
    counted. ``overlap`` False makes the ranks write synchronously (``PdJob.overlap``).
    """
    measured = pd_model(model)
    top = levels[-1]
    sizes = (deploy.cp_size, other_decode_cp_size(deploy.cp_size))
    jobs = [PdJob(deploy, tuple(batches), (levels[0], *levels), probe=True, overlap=overlap)]
    for size in sizes:
        resharded = deploy.model_copy(update={"decode_cp_size": size})
        jobs.append(PdJob(resharded, tuple(batches), (top, top), probe=True, overlap=overlap))
    reports, runs = run_pd(measured, jobs)
    for report in reports:
        if not report.ok:
            raise RuntimeError(
                f"PD transfer failed in the bench: {report.errors or report.requests}"
            )
    rows = tuple(_row(level, run, 1) for level, run in zip(levels, runs[0][1:], strict=True))
    reshard = (
        rows[-1],
        *(_row(top, job_runs[1], size) for size, job_runs in zip(sizes, runs[1:], strict=True)),
    )
    token_bytes = kv_bytes_per_page(measured, deploy.index_k_dtype, 1)
    return PdFigure(rows, measured.name, token_bytes, reshard)
