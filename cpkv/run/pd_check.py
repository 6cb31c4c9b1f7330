"""The checks of a PD run: every request's rebuilt KV and decode step against the
reference, joined with what each prefill rank sent; :class:`PdReport`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cpkv.run.failure_summary import FailureSummary
from cpkv.run.jobs import LevelRun, request_order
from cpkv.run.shadow import ShadowSummary
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.pd import (
    ReportReply,
    RequestReport,
    TensorData,
    from_data,
    to_data,
)
from cpkv_core.planning import (
    BatchSpec,
    RequestSpec,
    ScheduledRequest,
    Scheduler,
    pages_for_trace,
)
from cpkv_core.runtime import OUTPUT_ATOL, ReferenceModel, max_abs_diff


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
    failures: FailureSummary | None = None
    """The prefill batches that failed, were rolled back and rerun."""

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
            **({"failures": self.failures.to_json()} if self.failures is not None else {}),
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
