"""The checks of a PD run: every decode rank's rebuilt rows (the page positions it owns)
against the owned slice of the reference's KV, and the decode step against the reference's,
joined with what each prefill rank sent; :class:`PdReport`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
from cpkv_core.planning.pd_pack import token_rows
from cpkv_core.planning.pd_reshard import decode_positions
from cpkv_core.runtime import OUTPUT_ATOL, ReferenceModel, max_abs_diff


@dataclass(frozen=True, slots=True)
class PdRequestResult:
    """One request of one prefill run, after transfer and checks."""

    rid: str
    level: int
    ready: bool
    """Every decode rank completed the request and every prefill rank got the ack."""
    kv_equal: bool
    """Every decode rank's rows equal the owned slice of the reference, byte for byte."""
    decode_max_abs_diff: float | None
    """Largest difference of any decode rank's decode step from the reference's."""
    bytes_by_rank: tuple[int, ...]
    released_by_rank: tuple[bool, ...]
    decode_pages: int
    """Pages the request holds over every decode rank."""
    errors: tuple[str, ...]
    decode_topk_equal: bool = False
    """Every decode rank's top-k sets equal the reference's decode step's, every layer."""
    bytes_by_pair: tuple[tuple[int, ...], ...] = ()
    """``[prefill rank][decode rank]`` bytes of the last attempt."""

    @property
    def ok(self) -> bool:
        """Ready, rebuilt KV byte-equal to the reference, decode step's top-k equal and its
        outputs within tolerance."""
        diff = self.decode_max_abs_diff
        good_kv = self.ready and self.kv_equal and self.decode_topk_equal
        return good_kv and diff is not None and diff <= OUTPUT_ATOL


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
    decode_cp_size: int = 1
    """Decode ranks (1: a non-CP decode server)."""

    @property
    def ok(self) -> bool:
        """Every request went through and checks out."""
        return not self.errors and all(r.ok for r in self.requests)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON document of ``cpkv pd --json``."""
        return {
            "ok": self.ok,
            "cp_size": self.cp_size,
            "decode_cp_size": self.decode_cp_size,
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
                    "decode_topk_equal": r.decode_topk_equal,
                    "bytes_by_rank": list(r.bytes_by_rank),
                    "bytes_by_pair": [list(row) for row in r.bytes_by_pair],
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
    """Per layer ``(latent, index K as uint8, scale)``, row = token position."""
    decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    """The decode step's (last hidden, logits, top-k positions)."""


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
        result[rid] = ReferenceRequest(kv, (out.last_hidden, out.logits, out.topk))
    return result


def identical(got: TensorData, want: torch.Tensor) -> bool:
    """Same dtype, shape and bytes as ``want``, and equal to it as numbers, so a NaN (whose
    bytes may match) never counts as equal."""
    return got == to_data(want) and torch.equal(from_data(got), want)


def owned_rows(
    want: ReferenceRequest, page_size: int, dcp_rank: int, dcp_size: int
) -> list[torch.Tensor]:
    """The reference's rows of the page positions decode rank ``dcp_rank`` owns, three a
    layer, in the decode report's order."""
    seq_len = int(want.kv[0][0].shape[0])
    pages = -(-seq_len // page_size)
    tokens = token_rows(
        np.arange(pages, dtype=np.int64) * page_size,
        decode_positions(pages, dcp_rank, dcp_size),
        seq_len,
        page_size,
    )
    index = torch.from_numpy(tokens)
    return [t.index_select(0, index) for rows in want.kv for t in rows]


@dataclass(frozen=True, slots=True)
class RequestCheck:
    """One request's checks over every decode rank."""

    kv_equal: bool
    topk_equal: bool
    diff: float | None


def kv_matches(
    report: RequestReport, want: ReferenceRequest, page_size: int, shard: tuple[int, int]
) -> bool:
    """Decode rank ``shard = (rank, dcp_size)``'s rebuilt rows equal its owned slice of the
    reference, byte for byte."""
    ref = owned_rows(want, page_size, *shard)
    return len(report.kv) == len(ref) and all(
        identical(a, b) for a, b in zip(report.kv, ref, strict=True)
    )


def check_request(
    got: Sequence[RequestReport | None], want: ReferenceRequest, page_size: int
) -> RequestCheck:
    """Every decode rank's rows against its owned slice of the reference, byte for byte,
    and its decode step against the reference's (top-k exactly, outputs within tolerance)."""
    reports = [g for g in got if g is not None and g.ready]
    if not got or len(reports) < len(got):
        return RequestCheck(False, False, None)
    size = len(reports)
    kv_equal = all(kv_matches(r, want, page_size, (b, size)) for b, r in enumerate(reports))
    topk_equal, diffs = True, []
    for report in reports:
        try:
            hidden, logits, topk = (from_data(t) for t in report.decode)
        except ValueError:  # NOTE: not three tensors, or a malformed one: no decode step
            return RequestCheck(kv_equal, False, None)
        topk_equal &= torch.equal(topk, want.decode[2])
        diffs.append(
            max(max_abs_diff(hidden, want.decode[0]), max_abs_diff(logits, want.decode[1]))
        )
    return RequestCheck(kv_equal, topk_equal, max(diffs))


def pd_results(
    level_of_run: Sequence[int],
    runs: Sequence[LevelRun],
    reference: dict[str, ReferenceRequest],
    decode: Sequence[ReportReply] | None,
    prefix: str,
    page_size: int,
) -> list[PdRequestResult]:
    """Joins prefill send results, every decode rank's report and the reference."""
    reports = [{r.rid: r for r in reply.requests} for reply in decode or ()]
    results = []
    for run_index, (level, run) in enumerate(zip(level_of_run, runs, strict=True)):
        for i, rid in enumerate(reference):
            sends = [rank_results[i] for rank_results in run.pd]
            key = f"{prefix}{run_index}/{rid}"
            got = [by_rid.get(key) for by_rid in reports]
            checked = check_request(got, reference[rid], page_size)
            decode_errors = tuple(g.error for g in got if g is not None and g.error)
            results.append(
                PdRequestResult(
                    rid=rid,
                    level=level,
                    ready=bool(got)
                    and all(g is not None and g.ready for g in got)
                    and all(s.ready for s in sends),
                    kv_equal=checked.kv_equal,
                    decode_max_abs_diff=checked.diff,
                    bytes_by_rank=tuple(s.bytes_sent for s in sends),
                    released_by_rank=tuple(s.released for s in sends),
                    decode_pages=sum(g.pages for g in got if g is not None),
                    errors=tuple(e for s in sends for e in s.errors) + decode_errors,
                    decode_topk_equal=checked.topk_equal,
                    bytes_by_pair=tuple(s.bytes_by_dest for s in sends),
                )
            )
    return results
