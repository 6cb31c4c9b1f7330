"""Chunked prefill with KV sharding on, as SGLang 0.5.23 cuts chunks: page-multiple chunk
sizes, every chunk starting on a page boundary.

Read from the ``sglang==0.5.23`` wheel (paths inside it):

- ``srt/arg_groups/kv_shard_hook.py`` ``handle_kv_cache_sharding`` (lines 280-292): with
  ``--enable-kv-cache-sharding`` a ``--chunked-prefill-size`` that is not a multiple of the
  page size is rounded up to one (10000 -> 10048 at page 64), and chunked prefill must be on.
- ``srt/managers/schedule_policy.py`` ``PrefillAdder.add_chunked_req`` (lines 1149-1156):
  when the allocator is sharded (``kv_shard_granule`` = the page size, lines 720-724), a
  chunked request's next chunk ends where ``prefix_len + tokens`` floors to a page boundary;
  when that leaves nothing, it takes a whole chunk. A new request that is cut
  (``_select_prefill_admission``, lines 1664-1671) ends on a page boundary whatever the
  sharding (``exact_chunk_fill``, which does not floor, is AMD gfx95 only, lines 94-102;
  DSA KV sharding needs CUDA). So every chunk of a sharded server starts on a page boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv_core.planning.batch import BatchSpec

__all__ = [
    "MidPageResume",
    "mid_page_resumes",
    "mid_page_warning",
    "sharded_chunk_size",
    "sharded_next_chunk",
]


def sharded_chunk_size(chunked_prefill_size: int, page_size: int) -> int:
    """``--chunked-prefill-size`` as a sharded server runs it: up to a page multiple.

    Raises:
        ValueError: chunked prefill off (a size below 1), which KV sharding refuses, or a
            page size below 1.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if chunked_prefill_size < 1:
        raise ValueError(
            "KV sharding requires chunked prefill (--chunked-prefill-size > 0), got "
            f"{chunked_prefill_size} (sglang 0.5.23, srt/arg_groups/kv_shard_hook.py)"
        )
    return -(-chunked_prefill_size // page_size) * page_size


def sharded_next_chunk(prefix_len: int, chunk_tokens: int, page_size: int) -> int:
    """The most tokens a chunked request's next chunk may take on a sharded server, given
    ``chunk_tokens`` of chunk budget: its end floors to a page boundary, or a whole budget
    when flooring leaves nothing."""
    floored = (prefix_len + chunk_tokens) // page_size * page_size - prefix_len
    return floored if floored > 0 else chunk_tokens


@dataclass(frozen=True, slots=True)
class MidPageResume:
    """A continued chunk that starts inside a page."""

    batch: int
    rid: str
    prefix_len: int


def mid_page_resumes(batches: Sequence[BatchSpec], page_size: int) -> tuple[MidPageResume, ...]:
    """Every continued chunk of ``batches`` whose ``prefix_len`` is not a page multiple: a
    chunk a sharded SGLang 0.5.23 server never schedules."""
    seen: set[str] = set()
    found = []
    for batch in batches:
        for req in batch.requests:
            if req.rid in seen and req.prefix_len % page_size:
                found.append(MidPageResume(batch.batch, req.rid, req.prefix_len))
            seen.add(req.rid)
    return tuple(found)


def mid_page_warning(batches: Sequence[BatchSpec], page_size: int) -> str | None:
    """What to tell someone who runs ``batches`` with KV sharding on when some chunk resumes
    mid-page; None when none does.

    Such a trace runs as given: it is valid, cpkv computes it exactly, and phase 5 falls back
    (``OWNER_MISMATCH``) on a resumed page another rank owns. It is only not a schedule a
    sharded SGLang 0.5.23 server makes.
    """
    resumes = mid_page_resumes(batches, page_size)
    if not resumes:
        return None
    first = resumes[0]
    return (
        f"{len(resumes)} continued chunk(s) resume mid-page (first: batch {first.batch}, rid "
        f"{first.rid}, prefix_len {first.prefix_len}, page {page_size}); SGLang 0.5.23 with "
        "KV sharding starts every chunk on a page boundary "
        "(srt/managers/schedule_policy.py, add_chunked_req), so it never runs these batches. "
        "cpkv runs them as given; `cpkv trace synth --enable-kv-cache-sharding` makes the "
        "server's schedule"
    )
