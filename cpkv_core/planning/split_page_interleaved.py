"""Page-interleaved split (phase 4 under ``round-robin-split``), token by token: the oracle.

The token round-robin split deals batch token ``g`` to rank ``g % cp_size``, so every page
is computed by all ranks. The page-interleaved split deals by logical page instead: the
current tokens of page ``p`` (the page id in the request's page table, the id every rank
and the allocator share) go to rank ``p % cp_size``, the page's storage owner
(``ownership.owner_of_page``). Compute owner equals storage owner by construction, so a
chunk that resumes mid-page stays on the page's owner, whoever placed it: no allocation
policy is needed and no chunk can resume on a foreign page. Under the allocator's dealt
policy a request's consecutive pages sit on consecutive owners, so the deal is an
interleave of pages.

Segments are runs of pages, so ranks hold unequal token counts (whole pages, partial first
and last pages) and a rank's tokens of one request are not contiguous in the request; the
host plan groups each request's local rows from the segments, as for every split. The
numpy version used by the host plan (``segments``: O(pages)) is held to this one by the
tests. Whether a batch takes it is the gate's balance rule (``balance``).

Only Python ints are used; the tensor layer turns this metadata into index tensors once.
"""

from __future__ import annotations

from collections.abc import Sequence

from cpkv_core.config import CpMode
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.split import Segment, SplitMetadata

__all__ = ["build_page_interleaved_split", "compute_owner_of_current_pages"]


def _check(
    extend_lens: Sequence[int],
    prefix_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    cp_size: int,
    page_size: int,
) -> None:
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1 (1 means CP is off), got {cp_size}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1 (tokens per KV page), got {page_size}")
    if not len(extend_lens) == len(prefix_lens) == len(page_tables):
        raise ValueError(
            f"extend_lens, prefix_lens and page_tables need one entry per request, got "
            f"{len(extend_lens)}, {len(prefix_lens)} and {len(page_tables)}"
        )
    for i, (extend, prefix, table) in enumerate(
        zip(extend_lens, prefix_lens, page_tables, strict=True)
    ):
        if extend < 0 or prefix < 0:
            raise ValueError(f"request {i}: lengths must be >= 0, got {prefix=} {extend=}")
        if len(table) * page_size < prefix + extend:
            raise ValueError(
                f"request {i}: page table holds {len(table)} pages of {page_size} tokens, "
                f"fewer than its {prefix + extend} positions; pass the scheduled page tables"
            )


def compute_owner_of_current_pages(
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    cp_size: int,
    page_size: int,
) -> tuple[tuple[int, ...], ...]:
    """Per request, the rank computing each page its current tokens touch: the page's owner.

    Returns:
        Per request, entry ``j`` for page-table entry ``prefix_len // page_size + j``
        (empty for a request with no current tokens).
    """
    _check(extend_lens, prefix_lens, page_tables, cp_size, page_size)
    owners = []
    for prefix, extend, table in zip(prefix_lens, extend_lens, page_tables, strict=True):
        entries = range(prefix // page_size, -(-(prefix + extend) // page_size)) if extend else ()
        owners.append(tuple(owner_of_page(int(table[j]), cp_size) for j in entries))
    return tuple(owners)


def build_page_interleaved_split(
    extend_lens: Sequence[int],
    prefix_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    cp_size: int,
    page_size: int,
) -> SplitMetadata:
    """Page-interleaved split: current tokens on logical page ``p`` go to rank ``p % cp_size``.

    Segments are maximal runs of one rank's tokens within a request, in token order.

    Args:
        extend_lens: Current tokens per request, in batch order (each ``>= 0``).
        prefix_lens: Cached tokens per request, in batch order (each ``>= 0``).
        page_tables: Per request, its logical pages in position order (at least
            ``ceil((prefix_len + extend_len) / page_size)`` of them).
        cp_size: CP ranks (``>= 1``).
        page_size: Tokens per KV page (``>= 1``).

    Returns:
        The split, ``mode=CpMode.ROUND_ROBIN_SPLIT`` and ``page_aligned=True``.
    """
    _check(extend_lens, prefix_lens, page_tables, cp_size, page_size)
    local: list[list[int]] = [[] for _ in range(cp_size)]
    segments: list[list[Segment]] = [[] for _ in range(cp_size)]
    g = 0
    for request, (extend, prefix, table) in enumerate(
        zip(extend_lens, prefix_lens, page_tables, strict=True)
    ):
        for i in range(extend):
            rank = owner_of_page(int(table[(prefix + i) // page_size]), cp_size)
            runs = segments[rank]
            if runs and runs[-1].request_index == request and runs[-1].end == i:
                runs[-1] = Segment(request, runs[-1].start, runs[-1].length + 1)
            else:
                runs.append(Segment(request, i, 1))
            local[rank].append(g)
            g += 1
    return SplitMetadata(
        cp_size=cp_size,
        mode=CpMode.ROUND_ROBIN_SPLIT,
        local_token_indices=tuple(tuple(x) for x in local),
        segments=tuple(tuple(s) for s in segments),
        page_aligned=True,
    )
