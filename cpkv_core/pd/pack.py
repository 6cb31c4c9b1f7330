"""PD packing, the tensor side: gather a piece's token rows into a staging block, and
scatter a received block into the decode pool.

A block holds, for every layer and every pool tensor (latent KV, index K, index K scale),
the piece's ``[tokens, row_bytes]`` rows as raw bytes, one after the other. The row lists
come from ``cpkv_core.planning.pd_pack`` as ``PageRuns``: whole pages, then single rows. Here is
one ``index_select`` of whole pages and one of the rows after them per layer and tensor (into
the staging buffer, no copy in between on the same device), and ``index_copy_`` likewise
on the decode side. A page is ``page_size`` rows wide: a 4-byte scale row moves 256 bytes
at a time at page 64.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.planning.pd_pack import PageRuns
from cpkv_core.runtime.kv_pool import PagedKVPool, by_page


def row_views(pool: PagedKVPool) -> list[Tensor]:
    """Every pool tensor as ``[rows, row_bytes]`` uint8, layer by layer (latent, index K,
    scale): the order of a packed block."""
    return [
        tensor.view(torch.uint8).view(tensor.shape[0], -1)
        for layer in pool.layers
        for tensor in (layer.latent, layer.index_k, layer.index_k_scale)
    ]


def row_bytes(views: Sequence[Tensor]) -> tuple[int, ...]:
    """Bytes of one token row of each view; their sum is a token's bytes in a block."""
    return tuple(int(view.shape[1]) for view in views)


@dataclass(frozen=True, slots=True)
class PackIndex:
    """A piece's ``PageRuns`` as index tensors on the pool's device."""

    pages: Tensor
    rest: Tensor
    page_size: int

    def __len__(self) -> int:
        """Token rows in all."""
        return int(self.pages.shape[0]) * self.page_size + int(self.rest.shape[0])


def pack_index(runs: PageRuns, device: torch.device | str) -> PackIndex:
    """``runs`` uploaded to ``device``, once per piece."""
    pages = torch.from_numpy(runs.pages).to(device)
    return PackIndex(pages, torch.from_numpy(runs.rest).to(device), runs.page_size)


def pack_rows(views: Sequence[Tensor], index: PackIndex, block: Tensor) -> None:
    """Gathers the token rows ``index`` of every view into ``block [tokens * token_bytes]``
    (uint8): one ``page_size``-row copy per whole page, one row copy per row after them.

    On the views' device the gather writes straight into ``block``; from another device it
    gathers there and copies once.
    """
    whole, ps = len(index.pages) * index.page_size, index.page_size
    for view, out in _parts(views, index, block):
        pages_of_view = by_page(view, ps)
        if out.device == view.device:
            torch.index_select(pages_of_view, 0, index.pages, out=by_page(out[:whole], ps))
            torch.index_select(view, 0, index.rest, out=out[whole:])
        else:
            by_page(out[:whole], ps).copy_(pages_of_view.index_select(0, index.pages))
            out[whole:].copy_(view.index_select(0, index.rest))


def unpack_rows(views: Sequence[Tensor], index: PackIndex, block: Tensor) -> None:
    """Scatters ``block [tokens * token_bytes]`` (as packed by ``pack_rows``) into the token
    rows ``index`` of every view."""
    whole, ps = len(index.pages) * index.page_size, index.page_size
    for view, out in _parts(views, index, block):
        by_page(view, ps).index_copy_(0, index.pages, by_page(out[:whole], ps))
        view.index_copy_(0, index.rest, out[whole:])


def _parts(
    views: Sequence[Tensor], index: PackIndex, block: Tensor
) -> Iterator[tuple[Tensor, Tensor]]:
    """Each view and its ``[tokens, row_bytes]`` part of ``block``."""
    n = len(index)
    offset = 0
    for view in views:
        width = int(view.shape[1])
        yield view, block[offset : offset + n * width].view(n, width)
        offset += n * width
    assert offset == block.numel(), f"block of {block.numel()} bytes, {offset} in its rows"
