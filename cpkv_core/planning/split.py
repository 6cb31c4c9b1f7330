"""CP split metadata: which rank computes which current tokens of a batch (pure index math).

The batch's current tokens are numbered ``g = 0 .. num_tokens - 1``, request by request in
batch order. A split assigns every ``g`` to exactly one CP rank. Two token-balanced splits
are built here:

- zigzag (``CpMode.IN_SEQ_SPLIT``): every request is cut into ``2 * cp_size`` blocks of
  near-equal size and rank ``r`` computes blocks ``r`` and ``2 * cp_size - 1 - r``, which
  balances causal attention work;
- round-robin (``CpMode.ROUND_ROBIN_SPLIT``): token ``g`` goes to rank ``g % cp_size``.

Only Python ints are used; the tensor layer turns this metadata into index tensors once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv_core.config import CpMode

__all__ = [
    "Segment",
    "SplitMetadata",
    "build_round_robin_split",
    "build_split",
    "build_zigzag_split",
    "zigzag_block_sizes",
]


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of one request's current tokens computed by one rank.

    ``start`` counts from the request's first current token (not from its first prefix
    token), so the run covers current tokens ``[start, start + length)`` of the request.
    """

    request_index: int
    start: int
    length: int

    @property
    def end(self) -> int:
        """One past the last current token of the run, relative to the request."""
        return self.start + self.length


@dataclass(frozen=True, slots=True)
class SplitMetadata:
    """Which rank computes which current tokens of one batch.

    Invariant: the ``local_token_indices`` of all ranks partition ``range(num_tokens)``,
    each rank's indices ascend, and ``segments[r]`` describe exactly the tokens of
    ``local_token_indices[r]``, in the same order.

    Attributes:
        cp_size: CP ranks the batch is split over.
        mode: The split that produced this metadata.
        local_token_indices: Per rank, the batch-global indices ``g`` of the current tokens
            it computes, ascending.
        segments: Per rank, its tokens as runs within requests (zigzag: the rank's two
            blocks per request, empty blocks omitted; round-robin: maximal runs).
        page_aligned: True when every segment boundary falls on a page boundary of the
            logical position (set by phase 4's splits: the page-aligned zigzag and the
            page interleave).
    """

    cp_size: int
    mode: CpMode
    local_token_indices: tuple[tuple[int, ...], ...]
    segments: tuple[tuple[Segment, ...], ...]
    page_aligned: bool = False

    def __post_init__(self) -> None:
        if len(self.local_token_indices) != self.cp_size or len(self.segments) != self.cp_size:
            raise ValueError(
                f"SplitMetadata needs one entry per rank (cp_size={self.cp_size}), got "
                f"{len(self.local_token_indices)} local_token_indices and "
                f"{len(self.segments)} segments"
            )

    @property
    def num_tokens(self) -> int:
        """Current tokens of the whole batch."""
        return sum(len(local) for local in self.local_token_indices)

    def num_local(self, rank: int) -> int:
        """Current tokens computed by ``rank``."""
        return len(self.local_token_indices[rank])

    @property
    def max_local(self) -> int:
        """Most current tokens computed by any rank: the padded per-rank row count."""
        return max(len(local) for local in self.local_token_indices)

    def gather_index(self) -> tuple[int, ...]:
        """Row of every batch token in the padded all-gather stack.

        Every rank pads its local rows ``[num_local(r), ...]`` to ``[max_local, ...]`` and an
        all-gather stacks them as ``[cp_size * max_local, ...]``. Indexing that stack with
        this tuple gives the rows back in batch order.

        Returns:
            ``[num_tokens]``: entry ``g`` is ``rank * max_local + i`` where batch token ``g``
            is local row ``i`` of ``rank``.
        """
        max_local = self.max_local
        index = [0] * self.num_tokens
        for rank, local in enumerate(self.local_token_indices):
            base = rank * max_local
            for i, g in enumerate(local):
                index[g] = base + i
        return tuple(index)

    def owner_of_token(self) -> tuple[int, ...]:
        """Rank computing each batch token: ``[num_tokens]``, entry ``g`` is that rank."""
        owner = [0] * self.num_tokens
        for rank, local in enumerate(self.local_token_indices):
            for g in local:
                owner[g] = rank
        return tuple(owner)


def _check_split_inputs(extend_lens: Sequence[int], cp_size: int) -> None:
    """Raises ValueError unless ``cp_size >= 1`` and every length is ``>= 0``."""
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1 (1 means CP is off), got {cp_size}")
    for i, length in enumerate(extend_lens):
        if length < 0:
            raise ValueError(
                f"extend_lens must all be >= 0, got {length} for request {i}; "
                "pass the number of current tokens of every request"
            )


def zigzag_block_sizes(length: int, cp_size: int) -> tuple[int, ...]:
    """Sizes of the ``2 * cp_size`` zigzag blocks of one request.

    Block ``k`` holds ``length // S + (1 if k < length % S else 0)`` tokens with
    ``S = 2 * cp_size``, so sizes sum to ``length`` and differ by at most one. A request
    shorter than ``S`` simply leaves trailing blocks empty.

    Args:
        length: Current tokens of the request (``>= 0``).
        cp_size: CP ranks (``>= 1``).

    Returns:
        ``2 * cp_size`` block sizes, in block order.
    """
    _check_split_inputs((length,), cp_size)
    num_blocks = 2 * cp_size
    base, rem = divmod(length, num_blocks)
    return tuple(base + (1 if k < rem else 0) for k in range(num_blocks))


def _zigzag_request(request_index: int, length: int, cp_size: int) -> list[tuple[Segment, ...]]:
    """Per rank, the non-empty zigzag blocks ``r`` and ``2*cp_size-1-r`` of one request."""
    sizes = zigzag_block_sizes(length, cp_size)
    starts = [0] * len(sizes)
    for k in range(1, len(sizes)):
        starts[k] = starts[k - 1] + sizes[k - 1]
    per_rank: list[tuple[Segment, ...]] = []
    for rank in range(cp_size):
        blocks = (rank, 2 * cp_size - 1 - rank)
        per_rank.append(
            tuple(Segment(request_index, starts[k], sizes[k]) for k in blocks if sizes[k] > 0)
        )
    return per_rank


def build_zigzag_split(extend_lens: Sequence[int], cp_size: int) -> SplitMetadata:
    """Token-balanced zigzag split: rank ``r`` takes blocks ``r`` and ``2*cp_size-1-r``.

    Args:
        extend_lens: Current tokens per request, in batch order (each ``>= 0``).
        cp_size: CP ranks (``>= 1``).

    Returns:
        The split, ``mode=CpMode.IN_SEQ_SPLIT``.
    """
    _check_split_inputs(extend_lens, cp_size)
    segments: list[list[Segment]] = [[] for _ in range(cp_size)]
    local: list[list[int]] = [[] for _ in range(cp_size)]
    offset = 0
    for request_index, length in enumerate(extend_lens):
        for rank, request_segments in enumerate(_zigzag_request(request_index, length, cp_size)):
            for seg in request_segments:
                segments[rank].append(seg)
                local[rank].extend(range(offset + seg.start, offset + seg.end))
        offset += length
    return SplitMetadata(
        cp_size=cp_size,
        mode=CpMode.IN_SEQ_SPLIT,
        local_token_indices=tuple(tuple(x) for x in local),
        segments=tuple(tuple(s) for s in segments),
    )


def _round_robin_segments(
    extend_lens: Sequence[int], cp_size: int, rank: int
) -> tuple[Segment, ...]:
    """Maximal runs of ``rank``'s round-robin tokens, request by request."""
    segments: list[Segment] = []
    offset = 0
    for request_index, length in enumerate(extend_lens):
        if cp_size == 1:
            if length > 0:
                segments.append(Segment(request_index, 0, length))
        else:
            # NOTE: with cp_size > 1 consecutive tokens never share a rank: runs are length 1.
            first = (rank - offset) % cp_size
            segments.extend(Segment(request_index, j, 1) for j in range(first, length, cp_size))
        offset += length
    return tuple(segments)


def build_round_robin_split(extend_lens: Sequence[int], cp_size: int) -> SplitMetadata:
    """Round-robin split: batch token ``g`` goes to rank ``g % cp_size``.

    Args:
        extend_lens: Current tokens per request, in batch order (each ``>= 0``).
        cp_size: CP ranks (``>= 1``).

    Returns:
        The split, ``mode=CpMode.ROUND_ROBIN_SPLIT``.
    """
    _check_split_inputs(extend_lens, cp_size)
    num_tokens = sum(extend_lens)
    return SplitMetadata(
        cp_size=cp_size,
        mode=CpMode.ROUND_ROBIN_SPLIT,
        local_token_indices=tuple(
            tuple(range(rank, num_tokens, cp_size)) for rank in range(cp_size)
        ),
        segments=tuple(
            _round_robin_segments(extend_lens, cp_size, rank) for rank in range(cp_size)
        ),
    )


def build_split(extend_lens: Sequence[int], cp_size: int, mode: CpMode) -> SplitMetadata:
    """Builds the token-balanced split of ``mode`` (see the builders for each mode)."""
    if mode == CpMode.IN_SEQ_SPLIT:
        return build_zigzag_split(extend_lens, cp_size)
    if mode == CpMode.ROUND_ROBIN_SPLIT:
        return build_round_robin_split(extend_lens, cp_size)
    raise ValueError(f"cp mode must be one of {[m.value for m in CpMode]}, got {mode!r}")
