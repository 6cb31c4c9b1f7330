"""Page-aligned zigzag split (phase 4): zigzag blocks cut at logical page boundaries.

The token-balanced zigzag split (``cpkv_core.planning.split``) cuts a request's current tokens into
``2 * cp_size`` blocks of near-equal token counts, so a logical page may be computed by two
ranks. The page-aligned split cuts only where the logical position ``prefix_len + i`` is a
multiple of ``page_size``, so every current page has exactly one compute owner, which phase 5
needs to write KV straight into the computing rank's pool.

A request's current tokens occupy positions ``[prefix_len, prefix_len + extend_len)`` and
span ``ceil((prefix_len + extend_len) / page_size) - prefix_len // page_size`` pages: the
first page may be partial (a chunk that resumes mid-page) and so may the last. Whole pages
are dealt to the ``2 * cp_size`` blocks as evenly as possible (block ``k`` gets
``P // S + (1 if k < P % S else 0)`` pages), and rank ``r`` computes blocks ``r`` and
``2 * cp_size - 1 - r`` as in the token-balanced zigzag. Token counts of the blocks then
differ (partial pages, uneven page counts), which is why a rank's local q / indexer
weights follow its real segment rows (the engine indexes each request's rows from the
split's local token indices; :func:`local_pair_lengths` states the pair), never a half.

A request with fewer than ``2 * cp_size`` pages cannot give every block a page: it is short
and keeps the token-balanced split. Because the split is one per batch, a batch with any
short request takes the token-balanced split for all its requests (the gate reports
``SHORT_REQUEST``); the builders here refuse such a batch with ValueError.

Only Python ints are used; the tensor layer turns this metadata into index tensors once.
"""

from __future__ import annotations

from collections.abc import Sequence

from cpkv_core.config import CpMode
from cpkv_core.planning.split import Segment, SplitMetadata, zigzag_block_sizes

__all__ = [
    "build_page_aligned_zigzag_split",
    "compute_owner_of_pages",
    "is_short_page_count",
    "is_short_request",
    "local_pair_lengths",
    "page_aligned_block_sizes",
    "request_pages",
    "short_requests",
]


def _check_request(prefix_len: int, extend_len: int, page_size: int) -> None:
    """Raises ValueError unless the lengths are ``>= 0`` and ``page_size >= 1``."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1 (tokens per KV page), got {page_size}")
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0 (tokens already cached), got {prefix_len}")
    if extend_len < 0:
        raise ValueError(f"extend_len must be >= 0 (current tokens), got {extend_len}")


def _check_cp_size(cp_size: int) -> None:
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1 (1 means CP is off), got {cp_size}")


def request_pages(prefix_len: int, extend_len: int, page_size: int) -> int:
    """Logical pages touched by a request's current tokens.

    Positions ``[prefix_len, prefix_len + extend_len)`` are counted in page units: a first
    page that is partly history and a partly filled last page each count as one page.

    Args:
        prefix_len: Tokens of the request already in the KV cache (``>= 0``).
        extend_len: Current tokens of the request (``>= 0``).
        page_size: Tokens per KV page (``>= 1``).

    Returns:
        ``ceil((prefix_len + extend_len) / page_size) - prefix_len // page_size``; 0 when
        ``extend_len`` is 0.
    """
    _check_request(prefix_len, extend_len, page_size)
    if extend_len == 0:
        return 0
    return -(-(prefix_len + extend_len) // page_size) - prefix_len // page_size


def is_short_page_count(pages: int, cp_size: int) -> bool:
    """The short-request rule on a page count: ``0 < pages < 2 * cp_size``.

    A request with no current tokens is never short: it has no page to own, and refusing
    it would send the whole batch to the token-balanced split for nothing.
    """
    return 0 < pages < 2 * cp_size


def is_short_request(prefix_len: int, extend_len: int, cp_size: int, page_size: int) -> bool:
    """True when a request spans fewer than ``2 * cp_size`` pages and so keeps the
    token-balanced split (see :func:`is_short_page_count`)."""
    _check_cp_size(cp_size)
    return is_short_page_count(request_pages(prefix_len, extend_len, page_size), cp_size)


def short_requests(
    extend_lens: Sequence[int], prefix_lens: Sequence[int], cp_size: int, page_size: int
) -> tuple[int, ...]:
    """Indices of the requests too short for the page-aligned split (none: it applies)."""
    return tuple(
        i
        for i, (extend_len, prefix_len) in enumerate(zip(extend_lens, prefix_lens, strict=True))
        if is_short_request(prefix_len, extend_len, cp_size, page_size)
    )


def _short_request_error(
    what: str, prefix_len: int, extend_len: int, cp_size: int, page_size: int
) -> ValueError:
    pages = request_pages(prefix_len, extend_len, page_size)
    return ValueError(
        f"page-aligned split requires >= 2*cp_size={2 * cp_size} pages per request, got "
        f"pages={pages} for {what} (prefix_len={prefix_len}, "
        f"extend_len={extend_len}, page_size={page_size}); the request is short and needs "
        "the token-balanced split (build_zigzag_split) for the whole batch"
    )


def _block_starts(
    prefix_len: int, extend_len: int, cp_size: int, page_size: int
) -> tuple[int, ...]:
    """The ``2 * cp_size + 1`` block boundaries in tokens, relative to the first current
    token (the last is ``extend_len``). The caller has checked the request is not short."""
    pages = request_pages(prefix_len, extend_len, page_size)
    first_page = prefix_len // page_size
    end = prefix_len + extend_len
    bounds = [0]
    page_offset = 0
    for block_pages in zigzag_block_sizes(pages, cp_size):
        page_offset += block_pages
        position = min(max((first_page + page_offset) * page_size, prefix_len), end)
        bounds.append(position - prefix_len)
    return tuple(bounds)


def page_aligned_block_sizes(
    prefix_len: int, extend_len: int, cp_size: int, page_size: int
) -> tuple[int, ...]:
    """Token counts of the ``2 * cp_size`` page-aligned zigzag blocks of one request.

    Block ``k`` holds ``P // S + (1 if k < P % S else 0)`` of the request's pages
    (``S = 2 * cp_size``, ``P = request_pages(...)``); its token count follows from the page
    boundaries of the logical position, so only block 0 (a first page that resumes
    mid-page) and block ``S - 1`` (a partly filled last page) may hold a partial page.

    Args:
        prefix_len: Tokens of the request already in the KV cache (``>= 0``).
        extend_len: Current tokens of the request (``>= 0``).
        cp_size: CP ranks (``>= 1``).
        page_size: Tokens per KV page (``>= 1``).

    Returns:
        ``2 * cp_size`` block sizes in tokens, in block order, summing to ``extend_len``
        (all zero when ``extend_len`` is 0).

    Raises:
        ValueError: The request spans fewer than ``2 * cp_size`` pages
            (see :func:`is_short_request`).
    """
    _check_cp_size(cp_size)
    if is_short_request(prefix_len, extend_len, cp_size, page_size):
        raise _short_request_error("the request", prefix_len, extend_len, cp_size, page_size)
    bounds = _block_starts(prefix_len, extend_len, cp_size, page_size)
    return tuple(bounds[k + 1] - bounds[k] for k in range(2 * cp_size))


def _check_batch(
    extend_lens: Sequence[int], prefix_lens: Sequence[int], cp_size: int, page_size: int
) -> None:
    """Raises ValueError on bad input or on any short request."""
    _check_cp_size(cp_size)
    if len(extend_lens) != len(prefix_lens):
        raise ValueError(
            f"extend_lens and prefix_lens need one entry per request, got "
            f"{len(extend_lens)} and {len(prefix_lens)}"
        )
    for i, (extend_len, prefix_len) in enumerate(zip(extend_lens, prefix_lens, strict=True)):
        if is_short_request(prefix_len, extend_len, cp_size, page_size):
            raise _short_request_error(f"request {i}", prefix_len, extend_len, cp_size, page_size)


def build_page_aligned_zigzag_split(
    extend_lens: Sequence[int], prefix_lens: Sequence[int], cp_size: int, page_size: int
) -> SplitMetadata:
    """Page-aligned zigzag split: rank ``r`` takes page-aligned blocks ``r`` and
    ``2*cp_size-1-r`` of every request.

    Segments and local indices are laid out as in ``build_zigzag_split``: per rank, request
    by request, block ``r`` then block ``2*cp_size-1-r``, so local indices ascend. Every block
    of a non-empty request holds at least one page and so is never empty.

    Args:
        extend_lens: Current tokens per request, in batch order (each ``>= 0``).
        prefix_lens: Cached tokens per request, in batch order (each ``>= 0``).
        cp_size: CP ranks (``>= 1``).
        page_size: Tokens per KV page (``>= 1``).

    Returns:
        The split, ``mode=CpMode.IN_SEQ_SPLIT`` and ``page_aligned=True``.

    Raises:
        ValueError: Any request is short (fewer than ``2 * cp_size`` pages). The split is
            one per batch, so the caller (the gate) uses the token-balanced
            ``build_zigzag_split`` for the whole batch instead.
    """
    _check_batch(extend_lens, prefix_lens, cp_size, page_size)
    segments: list[list[Segment]] = [[] for _ in range(cp_size)]
    local: list[list[int]] = [[] for _ in range(cp_size)]
    offset = 0
    for request_index, (extend_len, prefix_len) in enumerate(
        zip(extend_lens, prefix_lens, strict=True)
    ):
        if extend_len > 0:
            bounds = _block_starts(prefix_len, extend_len, cp_size, page_size)
            for rank in range(cp_size):
                for block in (rank, 2 * cp_size - 1 - rank):
                    start, end = bounds[block], bounds[block + 1]
                    segments[rank].append(Segment(request_index, start, end - start))
                    local[rank].extend(range(offset + start, offset + end))
        offset += extend_len
    return SplitMetadata(
        cp_size=cp_size,
        mode=CpMode.IN_SEQ_SPLIT,
        local_token_indices=tuple(tuple(x) for x in local),
        segments=tuple(tuple(s) for s in segments),
        page_aligned=True,
    )


def compute_owner_of_pages(
    extend_lens: Sequence[int], prefix_lens: Sequence[int], cp_size: int, page_size: int
) -> tuple[tuple[int, ...], ...]:
    """The rank that computes each current page under the page-aligned split.

    Phase 5 allocates every current page on its compute owner, so that each rank writes
    the KV it computed into its own pool.

    Args:
        extend_lens: Current tokens per request, in batch order (each ``>= 0``).
        prefix_lens: Cached tokens per request, in batch order (each ``>= 0``).
        cp_size: CP ranks (``>= 1``).
        page_size: Tokens per KV page (``>= 1``).

    Returns:
        Per request, ``[request_pages(...)]``: entry ``j`` is the rank computing logical
        page ``prefix_len // page_size + j`` of the request (empty for an empty request).

    Raises:
        ValueError: Any request is short, as in :func:`build_page_aligned_zigzag_split`.
    """
    _check_batch(extend_lens, prefix_lens, cp_size, page_size)
    num_blocks = 2 * cp_size
    owners: list[tuple[int, ...]] = []
    for extend_len, prefix_len in zip(extend_lens, prefix_lens, strict=True):
        pages = request_pages(prefix_len, extend_len, page_size)
        per_page: list[int] = []
        for block, block_pages in enumerate(zigzag_block_sizes(pages, cp_size)):
            rank = block if block < cp_size else num_blocks - 1 - block
            per_page.extend([rank] * block_pages)
        owners.append(tuple(per_page))
    return tuple(owners)


def local_pair_lengths(split: SplitMetadata, rank: int, request_index: int) -> tuple[int, int]:
    """Real lengths of the two zigzag segments ``rank`` holds for one request.

    The local q / indexer weights of a request are split into the rank's first block
    (``r``) and second block (``2*cp_size-1-r``) by these lengths, never by half: the
    page-aligned blocks have unequal token counts. Also valid for the token-balanced
    zigzag, where an empty block is omitted (block sizes descend, so a lone segment is
    block ``r``).

    Args:
        split: A zigzag split (``mode=CpMode.IN_SEQ_SPLIT``).
        rank: CP rank, ``0 <= rank < split.cp_size``.
        request_index: Request in batch order.

    Returns:
        ``(first, second)`` token counts; ``(0, 0)`` where the rank holds none of the
        request, ``(first, 0)`` where it holds one block.
    """
    if split.mode != CpMode.IN_SEQ_SPLIT:
        raise ValueError(f"local_pair_lengths needs a zigzag (in-seq) split, got {split.mode}")
    if not 0 <= rank < split.cp_size:
        raise ValueError(f"rank must be in [0, {split.cp_size}), got {rank}")
    lengths = [seg.length for seg in split.segments[rank] if seg.request_index == request_index]
    if len(lengths) > 2:
        raise RuntimeError(
            f"rank {rank} holds {len(lengths)} segments of request {request_index}; a zigzag "
            "split holds at most 2, which indicates a bug in the split builder"
        )
    lengths.extend([0] * (2 - len(lengths)))
    return lengths[0], lengths[1]
