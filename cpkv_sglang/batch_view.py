"""cpkv's ``ScheduledBatch`` of a batch SGLang scheduled, for cpkv's gate: :func:`scheduled_view`.

SGLang's scheduler allocates its own pages, so the view lays each request's pages out one
after another: the lengths are SGLang's, the page ids are not. That is all the gate reads
for the phases the plugin runs (the CP-off rules and phase 1 read lengths, the speculative
algorithm and each request's logprob and capture flags); phases 3-5, which read page
tables, run only on cpkv's engine.
"""

from __future__ import annotations

import numpy as np

from cpkv_core.planning import BatchSpec, ScheduledBatch, ScheduledRequest, owner_load, rid_key

__all__ = ["scheduled_view"]


def scheduled_view(spec: BatchSpec, page_size: int, cp_size: int) -> ScheduledBatch:
    """``spec`` (from :func:`flags.batch_from_forward_batch`) as a ``ScheduledBatch`` whose
    pages are numbered in request order (O(pages), numpy)."""
    requests = []
    tables = []
    first_page = 0
    new_pages = []
    for req in spec.requests:
        pages = -(-req.seq_len // page_size)
        table = np.arange(first_page, first_page + pages, dtype=np.int64)
        first_page += pages
        tables.append(table)
        new_pages.append(table[req.prefix_len // page_size :])
        requests.append(
            ScheduledRequest(
                rid=req.rid,
                prefix_len=req.prefix_len,
                extend_len=req.extend_len,
                page_table=table,
                rid_key=rid_key(req.rid),
                return_logprob=req.return_logprob,
                capture_hidden=req.capture_hidden,
            )
        )
    extend_lens = tuple(r.extend_len for r in spec.requests)
    prefix_lens = tuple(r.prefix_len for r in spec.requests)
    return ScheduledBatch(
        batch=spec.batch,
        spec=spec.spec,
        requests=tuple(requests),
        page_size=page_size,
        cp_size=cp_size,
        new_pages=np.concatenate(new_pages) if new_pages else np.zeros(0, dtype=np.int64),
        on_compute_owners=False,
        extend_lens=extend_lens,
        prefix_lens=prefix_lens,
        current_pages=tuple(
            -(-(p + e) // page_size) - p // page_size
            for p, e in zip(prefix_lens, extend_lens, strict=True)
        ),
        owner_load=owner_load(extend_lens, prefix_lens, tables, cp_size, page_size),
    )
