"""What the decode server reports of a request: the state of its latest attempt and, once
it is ready, the rebuilt KV rows and the outputs of one decode step on them."""

from __future__ import annotations

import torch

from cpkv_core.dist.typed.tensor_data import to_data
from cpkv_core.pd.attempt import Attempt, AttemptState
from cpkv_core.pd.protocol import RequestReport
from cpkv_core.planning import BatchSpec, RequestSpec, ScheduledRequest, Scheduler
from cpkv_core.runtime.reference import ReferenceModel


def request_report(
    attempt: Attempt,
    model: ReferenceModel,
    scheduler: Scheduler,
    decoded: dict[str, tuple[torch.Tensor, torch.Tensor]],
    history: dict[str, list[str]],
) -> RequestReport:
    """The report of ``attempt``. A ready request's decode step runs once and is kept in
    ``decoded`` (last hidden, logits by rid); ``history`` holds each rid's failed attempts."""
    failures = "; ".join(history.get(attempt.rid, []))
    pages = len(scheduler.page_table(attempt.key)) if attempt.key in scheduler else 0
    if attempt.state is not AttemptState.READY:
        state = failures or f"attempt {attempt.attempt} {attempt.state}"
        return RequestReport(attempt.rid, False, state, pages)
    if attempt.rid not in decoded:
        step = RequestSpec(attempt.key, attempt.seq_len, 1)
        (scheduled,) = scheduler.schedule(BatchSpec(0, (step,))).requests
        out = model.run_request(scheduled, [attempt.next_token])
        decoded[attempt.rid] = (out.last_hidden, out.logits)
    request = _request_view(scheduler, attempt.key)
    locs = model.locs(request, 0, attempt.seq_len)
    kv = [model.pool.read(layer, locs) for layer in range(len(model.pool.layers))]
    rows = [t for k in kv for t in (k.latent, k.index_k.view(torch.uint8), k.index_k_scale)]
    return RequestReport(
        attempt.rid,
        True,
        failures,
        len(scheduler.page_table(attempt.key)),
        tuple(to_data(t) for t in rows),
        tuple(to_data(t) for t in decoded[attempt.rid]),
    )


def _request_view(scheduler: Scheduler, rid: str) -> ScheduledRequest:
    """A scheduled-request view of what ``rid`` holds (its page table, for reads)."""
    return ScheduledRequest(rid, 0, scheduler.seq_len(rid), scheduler.page_table(rid), 0)
