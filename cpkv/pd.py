"""``cpkv pd``: prefill on CP ranks, transfer every request to a non-CP decode process over
Mooncake, and check the rebuilt KV and a decode step against the reference."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Client
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from cpkv.runner import (
    BatchProgress,
    LevelRun,
    RankJob,
    request_order,
    run_jobs_on_gloo,
)
from cpkv.shadow_report import ShadowSummary, fault_phase, run_entries, summarize
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist import decode_frame
from cpkv_core.pd import (
    LOOPBACK,
    MIN_WRITE_BYTES,
    STAGING_BYTES,
    Message,
    PdFaults,
    PdTarget,
    Report,
    ReportReply,
    RequestReport,
    Shutdown,
    Started,
    TensorData,
    WireError,
    call,
    from_data,
    serve_decode,
    to_data,
)
from cpkv_core.planning import (
    BatchSpec,
    RequestSpec,
    ScheduledRequest,
    Scheduler,
    pages_for_trace,
)
from cpkv_core.runtime import OUTPUT_ATOL, Fault, ReferenceModel, max_abs_diff
from phases import PhaseId


class DecodeServerError(RuntimeError):
    """The decode process could not start, or died."""


@dataclass
class DecodeProcess:
    """A decode server running in its own process, and how to talk to it."""

    process: BaseProcess
    address: tuple[str, int]
    session: str
    authkey: bytes

    def call(self, message: Message) -> Message | None:
        """One control round trip (a reply that is not a protocol frame is an error too)."""
        try:
            with Client(self.address, authkey=self.authkey) as conn:
                return call(conn, message)
        except (EOFError, OSError) as exc:
            code = self.process.exitcode
            raise DecodeServerError(
                f"decode server unreachable (exit code {code}): {exc!r}"
            ) from exc
        except WireError as exc:
            raise DecodeServerError(f"decode server sent a bad frame: {exc}") from exc

    def report(self) -> ReportReply:
        """Every request's state, rebuilt KV and decode step."""
        reply = self.call(Report())
        assert isinstance(reply, ReportReply), reply
        return reply

    def stop(self) -> None:
        """Shuts the server down (kills it if it does not exit)."""
        if self.process.is_alive():
            with contextlib.suppress(DecodeServerError):
                self.call(Shutdown())
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def start_decode(
    model: ModelConfig,
    deploy: DeploymentConfig,
    num_pages: int,
    timeout_s: float,
    die_on_done_of: str | None = None,
    host: str = LOOPBACK,
) -> DecodeProcess:
    """Starts a decode server process listening on ``host`` and waits until it listens."""
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    authkey = os.urandom(16)
    args = (model, deploy.page_size, deploy.index_k_dtype, num_pages, timeout_s, authkey, writer)
    process = ctx.Process(
        target=serve_decode,
        args=args,
        kwargs={"die_on_done_of": die_on_done_of, "host": host},
        daemon=True,
    )
    process.start()
    writer.close()  # NOTE: the child holds the only writer: its death reads as EOF
    with reader, contextlib.suppress(EOFError):
        if reader.poll(120):
            frame = reader.recv_bytes()
            address, session = decode_frame(frame, Started, "the decode server's address")
            return DecodeProcess(process, address, session, authkey)
    process.kill()
    raise DecodeServerError(f"decode server did not start (exit code {process.exitcode})")


@dataclass(frozen=True, slots=True)
class PdRequestResult:
    """One request of one prefill run, after transfer and checks."""

    rid: str
    level: int
    ready: bool
    kv_equal: bool
    decode_max_abs_diff: float | None
    bytes_by_rank: tuple[int, ...]
    released_by_rank: tuple[bool, ...]
    decode_pages: int
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Ready, rebuilt KV byte-equal to the reference, decode step within tolerance."""
        diff = self.decode_max_abs_diff
        return self.ready and self.kv_equal and diff is not None and diff <= OUTPUT_ATOL


@dataclass(frozen=True, slots=True)
class PdReport:
    """Every request of every prefill run."""

    cp_size: int
    requests: tuple[PdRequestResult, ...]
    errors: tuple[str, ...] = field(default=())
    shadow: ShadowSummary | None = None
    """The prefill's shadow comparisons, when a shadow rate or a fault was set."""

    @property
    def ok(self) -> bool:
        """Every request went through and checks out."""
        return not self.errors and all(r.ok for r in self.requests)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON document of ``cpkv pd --json``."""
        return {
            "ok": self.ok,
            "cp_size": self.cp_size,
            "errors": list(self.errors),
            **({"shadow": self.shadow.to_json()} if self.shadow is not None else {}),
            "requests": [
                {
                    "rid": r.rid,
                    "level": r.level,
                    "ok": r.ok,
                    "ready": r.ready,
                    "kv_equal": r.kv_equal,
                    "decode_max_abs_diff": r.decode_max_abs_diff,
                    "bytes_by_rank": list(r.bytes_by_rank),
                    "released_by_rank": list(r.released_by_rank),
                    "decode_pages": r.decode_pages,
                    "errors": list(r.errors),
                }
                for r in self.requests
            ],
        }


@dataclass(frozen=True, slots=True)
class ReferenceRequest:
    """What the oracle holds for a finished request: KV rows by position, and a decode step."""

    kv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    decode: tuple[torch.Tensor, torch.Tensor]


def reference_requests(
    model: ModelConfig, deploy: DeploymentConfig, batches: Sequence[BatchSpec]
) -> dict[str, ReferenceRequest]:
    """Runs the trace on the reference, then reads every request's KV and decodes one token."""
    num_pages = pages_for_trace(batches, deploy.page_size, 1) + len(request_order(batches))
    scheduler = Scheduler(num_pages, deploy.page_size)
    reference = ReferenceModel(model, num_pages, deploy.page_size, deploy.index_k_dtype)
    latest: dict[str, ScheduledRequest] = {}
    for batch in batches:
        scheduled = scheduler.schedule(batch)
        reference.run_batch(scheduled)
        latest.update((r.rid, r) for r in scheduled.requests)
    result = {}
    for index, rid in enumerate(request_order(batches)):
        seq_len = latest[rid].seq_len
        locs = reference.locs(latest[rid], 0, seq_len)
        rows = [reference.pool.read(layer, locs) for layer in range(model.num_layers)]
        kv = [(r.latent, r.index_k.view(torch.uint8), r.index_k_scale) for r in rows]
        step = scheduler.schedule(BatchSpec(len(batches) + index, (RequestSpec(rid, seq_len, 1),)))
        out = reference.run_request(step.requests[0])
        result[rid] = ReferenceRequest(kv, (out.last_hidden, out.logits))
    return result


def identical(got: TensorData, want: torch.Tensor) -> bool:
    """Same dtype, shape and bytes as ``want``, and equal to it as numbers, so a NaN (whose
    bytes may match) never counts as equal."""
    return got == to_data(want) and torch.equal(from_data(got), want)


def _check(got: RequestReport | None, want: ReferenceRequest) -> tuple[bool, float | None]:
    """(rebuilt KV equal byte for byte, largest decode-step difference) of one request."""
    if got is None or not got.ready:
        return False, None
    ref = [t for rows in want.kv for t in rows]
    kv_equal = len(got.kv) == len(ref) and all(
        identical(a, b) for a, b in zip(got.kv, ref, strict=True)
    )
    try:
        hidden, logits = (from_data(t) for t in got.decode)
    except ValueError:  # NOTE: not two tensors, or a malformed one: no decode step to check
        return kv_equal, None
    diff = max(max_abs_diff(hidden, want.decode[0]), max_abs_diff(logits, want.decode[1]))
    return kv_equal, diff


def pd_results(
    level_of_run: Sequence[int],
    runs: Sequence[LevelRun],
    reference: dict[str, ReferenceRequest],
    decode: ReportReply | None,
    prefix: str,
) -> list[PdRequestResult]:
    """Joins prefill send results, the decode server's report and the reference."""
    reports = {r.rid: r for r in decode.requests} if decode else {}
    results = []
    for run_index, (level, run) in enumerate(zip(level_of_run, runs, strict=True)):
        for i, rid in enumerate(reference):
            sends = [rank_results[i] for rank_results in run.pd]
            got = reports.get(f"{prefix}{run_index}/{rid}")
            kv_equal, diff = _check(got, reference[rid])
            errors = tuple(e for s in sends for e in s.errors) + (
                (got.error,) if got and got.error else ()
            )
            results.append(
                PdRequestResult(
                    rid=rid,
                    level=level,
                    ready=bool(got and got.ready) and all(s.ready for s in sends),
                    kv_equal=kv_equal,
                    decode_max_abs_diff=diff,
                    bytes_by_rank=tuple(s.bytes_sent for s in sends),
                    released_by_rank=tuple(s.released for s in sends),
                    decode_pages=got.pages if got else 0,
                    errors=errors,
                )
            )
    return results


@dataclass(frozen=True, slots=True)
class PdHosts:
    """Where the PD processes are reached: host names or addresses, never wildcards."""

    decode: str = LOOPBACK
    """The decode server's control listener and transfer engine (``--pd-host``)."""
    prefill: str = LOOPBACK
    """The prefill ranks' transfer engines (``--pd-local-host``)."""


@dataclass(frozen=True, slots=True)
class PdJob:
    """One deployment's trace at some levels, for a PD run."""

    deploy: DeploymentConfig
    batches: tuple[BatchSpec, ...]
    levels: tuple[int, ...]
    enabled: frozenset[PhaseId] = frozenset(PhaseId)
    ceiling: int | None = None
    debug_checks: bool = False
    """Run the sharded-KV invariant checks on the prefill ranks (they synchronise)."""
    shadow_rate: float = 0.0
    """Share of prefill batches shadow-verified."""
    fault: Fault | None = None
    """A game-day fault injected into the prefill's candidate path."""
    staging_bytes: int = STAGING_BYTES
    """Bytes of one PD write call at most (each prefill rank's staging buffer)."""
    min_write_bytes: int = MIN_WRITE_BYTES
    """Queued bytes that make a prefill rank write before a request's final chunk."""
    probe: bool = False
    """After each level, the ranks time the bench's baselines: one large write of the level's
    KV bytes (rank 0) and every rank writing its share at once (``probe.time_baselines``)."""
    overlap: bool = True
    """Prefill ranks write on a writer thread while they compute; False: synchronously."""
    batch_timeout_s: float = 60.0
    """Seconds a prefill batch's collective waits for a stalled rank."""


def decode_pages_for(batches: Sequence[BatchSpec], page_size: int) -> int:
    """Decode-side pages for every request of a trace (no prefix sharing there) plus the
    decode step's token."""
    seq_lens: dict[str, int] = {}
    for batch in batches:
        for req in batch.requests:
            seq_lens[req.rid] = req.seq_len
    return sum(-(-(n + 1) // page_size) for n in seq_lens.values())


def run_pd(
    model: ModelConfig,
    jobs: Sequence[PdJob],
    timeout_s: float = 30.0,
    retries: int = 0,
    faults: PdFaults | None = None,
    die_on_done_of: str | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    hosts: PdHosts | None = None,
) -> tuple[list[PdReport], list[list[LevelRun]]]:
    """Prefill every job on ONE gloo group (subgroups for smaller CP sizes), send every
    request of every level to ONE decode process, check each against the reference.

    Jobs must share page size and index K dtype (the decode pool has one layout). ``hosts``
    names the decode server's and the prefill ranks' addresses (loopback by default).
    """
    hosts = hosts or PdHosts()
    first = jobs[0].deploy
    decode_pages = sum(
        len(job.levels) * decode_pages_for(job.batches, first.page_size) for job in jobs
    )
    decode = start_decode(model, first, decode_pages, timeout_s, die_on_done_of, hosts.decode)
    try:
        rank_jobs = [
            RankJob(
                model,
                job.deploy,
                job.batches,
                job.levels,
                pages_for_trace(job.batches, job.deploy.page_size, job.deploy.cp_size),
                enabled=job.enabled,
                ceiling=job.ceiling,
                debug_checks=job.debug_checks,
                shadow_rate=job.shadow_rate,
                fault=job.fault,
                batch_timeout_s=job.batch_timeout_s,
                pd=PdTarget(
                    decode.address,
                    decode.authkey,
                    f"j{index}/",
                    retries,
                    faults or PdFaults(),
                    job.staging_bytes,
                    job.min_write_bytes,
                    job.probe,
                    hosts.prefill,
                    job.overlap,
                ),
            )
            for index, job in enumerate(jobs)
        ]
        runs = run_jobs_on_gloo(rank_jobs, on_progress)
        try:
            decode_report: ReportReply | None = decode.report()
            errors: tuple[str, ...] = ()
        except DecodeServerError as exc:
            decode_report, errors = None, (str(exc),)
    finally:
        decode.stop()
    reports = []
    for index, (job, job_runs) in enumerate(zip(jobs, runs, strict=True)):
        reference = reference_requests(model, job.deploy, job.batches)
        results = pd_results(job.levels, job_runs, reference, decode_report, f"j{index}/")
        shadow = None
        if job.shadow_rate > 0 or job.fault is not None:
            entries = [
                e for lv, r in zip(job.levels, job_runs, strict=True) for e in run_entries(lv, r)
            ]
            fault = None if job.fault is None else f"{fault_phase(job.fault)}:{job.fault.kind}"
            wrong = sum(not r.ok for r in results)
            shadow = summarize(job.shadow_rate, fault, entries, wrong)
        reports.append(PdReport(job.deploy.cp_size, tuple(results), errors, shadow))
    return reports, runs
