"""A batch's current tokens as runs of logical pages: every page they touch, in numpy.

A request's current tokens sit at positions ``[prefix_len, prefix_len + extend_len)``; the
page-table entries ``prefix_len // page_size ..`` hold them, one run of batch tokens per
entry (a partial first page when the chunk resumes mid-page, a partial last page). The host
plan writes these runs, and the page-interleaved split deals them to ranks by their page's
owner. O(pages) with vectorised ops, no loop per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["PageRuns", "current_page_runs", "flatten_tables"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PageRuns:
    """Every page a batch's current tokens touch, as runs of batch tokens.

    Invariant: the runs ascend in ``g0`` (request by request, page by page) and cover every
    batch token exactly once; a run never crosses a page or a request.
    """

    page: IntArray
    """Logical page id of each run (from the request's page table)."""
    g0: IntArray
    """Batch token index of the run's first token."""
    count: IntArray
    """Tokens in the run (``>= 1``)."""
    offset: IntArray
    """Position in the page of the run's first token."""
    request: IntArray
    """Request index of each run."""
    position0: IntArray
    """Logical position of the run's first token."""


def flatten_tables(tables: Sequence[IntArray]) -> tuple[IntArray, IntArray]:
    """``(every table's pages concatenated, [bs + 1] start of each table in it)``."""
    flat = np.concatenate(tables).astype(np.int64) if tables else np.empty(0, np.int64)
    table_cu = np.concatenate([[0], np.cumsum([len(t) for t in tables])]).astype(np.int64)
    return flat, table_cu


def current_page_runs(
    extend_lens: Sequence[int],
    prefix_lens: Sequence[int],
    flat_tables: IntArray,
    table_cu: IntArray,
    page_size: int,
) -> PageRuns:
    """The runs of a batch's current tokens, one per page-table entry they touch.

    Args:
        extend_lens: Current tokens per request, in batch order (each ``>= 0``).
        prefix_lens: Cached tokens per request, in batch order (each ``>= 0``).
        flat_tables: Every request's page table concatenated (``flatten_tables``).
        table_cu: ``[bs + 1]`` start of each request's table in ``flat_tables``.
        page_size: Tokens per KV page (``>= 1``).
    """
    ps = page_size
    extend = np.asarray(extend_lens, np.int64)
    prefix = np.asarray(prefix_lens, np.int64)
    seq = prefix + extend
    cu_extend = np.concatenate([[0], np.cumsum(extend)]).astype(np.int64)
    pages = np.where(extend > 0, -(-seq // ps) - prefix // ps, 0)
    req = np.repeat(np.arange(len(pages), dtype=np.int64), pages)
    first = np.cumsum(pages) - pages
    j = prefix[req] // ps + np.arange(len(req), dtype=np.int64) - first[req]
    start = np.maximum(j * ps, prefix[req])
    end = np.minimum((j + 1) * ps, seq[req])
    return PageRuns(
        page=flat_tables[table_cu[req] + j],
        g0=cu_extend[req] + start - prefix[req],
        count=end - start,
        offset=start - j * ps,
        request=req,
        position0=start,
    )
