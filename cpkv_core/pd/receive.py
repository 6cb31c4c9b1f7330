"""The decode side's receive memory: one registered buffer, one slab per transfer attempt.

Prefill ranks write packed pieces into an attempt's slab; once every rank reported, the
decode server checks the pieces tile the slab and unpacks them into its pool by logical page
position. A slab lives exactly as long as its attempt's pages: a failed attempt's slab stays
quarantined until every sender settled, like its pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from cpkv_core.pd.pack import pack_index, unpack_rows
from cpkv_core.pd.protocol import Piece
from cpkv_core.pd.transport import Transport
from cpkv_core.planning.pd_pack import page_runs, token_rows, tokens_of_positions
from cpkv_core.planning.pd_reshard import decode_first_rows, decode_positions


class ArenaFullError(ValueError):
    """No free range of the receive buffer is large enough for a slab."""


class ReceiveArena:
    """A registered uint8 buffer carved into slabs, first fit.

    Invariant: live slabs and free ranges are disjoint, sorted, and tile the buffer; adjacent
    free ranges are merged.
    """

    def __init__(self, nbytes: int, transport: Transport) -> None:
        self.buffer = torch.zeros(nbytes, dtype=torch.uint8)
        """``[nbytes]`` the registered receive memory."""
        transport.register([self.buffer])
        self._free: list[tuple[int, int]] = [(0, nbytes)]
        """(offset, length) of every free range, by offset."""
        self._live: dict[str, tuple[int, int]] = {}

    def alloc(self, key: str, nbytes: int) -> int:
        """A slab of ``nbytes`` for ``key``; returns its offset.

        Raises:
            ArenaFullError: no free range holds ``nbytes`` (free some attempts first).
        """
        if nbytes == 0:  # NOTE: a decode rank that stores no page of the request
            self._live[key] = (0, 0)
            return 0
        for i, (offset, length) in enumerate(self._free):
            if length >= nbytes:
                rest = (offset + nbytes, length - nbytes)
                self._free[i : i + 1] = [rest] if rest[1] else []
                self._live[key] = (offset, nbytes)
                return offset
        largest = max((length for _, length in self._free), default=0)
        raise ArenaFullError(
            f"receive buffer has no {nbytes} free bytes in one range (largest {largest} of "
            f"{self.buffer.numel()}); wait for transfers in flight to finish"
        )

    def free(self, key: str) -> None:
        """Returns ``key``'s slab to the free ranges (no-op when it holds none)."""
        if key not in self._live:
            return
        offset, nbytes = self._live.pop(key)
        if nbytes == 0:
            return
        ranges = sorted([*self._free, (offset, nbytes)])
        merged = [ranges[0]]
        for start, length in ranges[1:]:
            last_start, last_length = merged[-1]
            if last_start + last_length == start:
                merged[-1] = (last_start, last_length + length)
            else:
                merged.append((start, length))
        self._free = merged

    def slab(self, key: str) -> tuple[int, int]:
        """(offset, bytes) of ``key``'s slab."""
        return self._live[key]

    @property
    def address(self) -> int:
        """Address of the buffer's first byte."""
        return int(self.buffer.data_ptr())


def tiling_error(
    pieces: Sequence[Piece], slab_bytes: int, seq_len: int, page_size: int, token_bytes: int
) -> str:
    """Why ``pieces`` do not tile a slab of ``slab_bytes`` without overlap, or "".

    A piece's length follows from its positions (``tokens x token_bytes``).
    """
    spans = sorted(
        (piece.offset, piece.offset + _piece_bytes(piece, seq_len, page_size, token_bytes))
        for piece in pieces
    )
    end = 0
    for start, stop in spans:
        if start < end or stop > slab_bytes:
            return f"pieces overlap or leave the slab: {spans} in {slab_bytes} bytes"
        end = stop
    return ""


def _piece_bytes(piece: Piece, seq_len: int, page_size: int, token_bytes: int) -> int:
    positions = np.asarray(piece.positions, dtype=np.int64)
    return int(tokens_of_positions(positions, seq_len, page_size).sum()) * token_bytes


def unpack_pieces(
    views: Sequence[Tensor],
    slab: Tensor,
    pieces: Sequence[Piece],
    first_rows: np.ndarray,
    seq_len: int,
    page_size: int,
) -> None:
    """Scatters every piece of ``slab [bytes]`` into the pool by logical page position.

    Args:
        views: the decode pool as ``pack.row_views``.
        first_rows: ``[pages]`` decode pool row of each position's first token.
    """
    token_bytes = sum(int(view.shape[1]) for view in views)
    for piece in pieces:
        positions = np.asarray(piece.positions, dtype=np.int64)
        rows = page_runs(token_rows(first_rows, positions, seq_len, page_size), page_size)
        block = slab[piece.offset : piece.offset + len(rows) * token_bytes]
        unpack_rows(views, pack_index(rows, views[0].device), block)


@dataclass(frozen=True, slots=True)
class Shard:
    """Which positions a decode rank holds: ``position % dcp_size == dcp_rank``."""

    page_size: int
    dcp_rank: int
    dcp_size: int


def rebuild(
    views: Sequence[Tensor],
    slab: Tensor,
    pieces: Sequence[Piece],
    seq_len: int,
    local_table: np.ndarray,
    shard: Shard,
) -> str:
    """Checks that ``pieces`` cover the rank's positions exactly once and tile ``slab``, then
    unpacks them into its pool at its own pages; returns why not (nothing unpacked), or "".

    Args:
        local_table: the rank's pages of its positions, in position order.
    """
    covered = sorted(p for piece in pieces for p in piece.positions)
    pages = -(-seq_len // shard.page_size)
    mine = decode_positions(pages, shard.dcp_rank, shard.dcp_size).tolist()
    if covered != mine:
        return f"pieces cover positions {covered}, need {mine} once"
    token_bytes = sum(int(view.shape[1]) for view in views)
    tiling = tiling_error(pieces, slab.numel(), seq_len, shard.page_size, token_bytes)
    if tiling:
        return tiling
    first_rows = decode_first_rows(
        local_table, pages, shard.page_size, shard.dcp_rank, shard.dcp_size
    )
    unpack_pieces(views, slab, pieces, first_rows, seq_len, shard.page_size)
    return ""
