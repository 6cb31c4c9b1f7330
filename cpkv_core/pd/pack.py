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
from typing import NamedTuple

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
    same_device = block.device == views[0].device if views else True
    for view, view_pages, out_pages, out_rest in _parts(views, index, block):
        if same_device:
            torch.index_select(view_pages, 0, index.pages, out=out_pages)
            if out_rest is not None:
                torch.index_select(view, 0, index.rest, out=out_rest)
        else:
            out_pages.copy_(view_pages.index_select(0, index.pages))
            if out_rest is not None:
                out_rest.copy_(view.index_select(0, index.rest))


def unpack_rows(views: Sequence[Tensor], index: PackIndex, block: Tensor) -> None:
    """Scatters ``block [tokens * token_bytes]`` (as packed by ``pack_rows``) into the token
    rows ``index`` of every view."""
    for view, view_pages, out_pages, out_rest in _parts(views, index, block):
        view_pages.index_copy_(0, index.pages, out_pages)
        if out_rest is not None:
            view.index_copy_(0, index.rest, out_rest)


class _Part(NamedTuple):
    """One view and its part of a block: ``out_pages [p, page_size * row_bytes]`` for the
    whole pages, then ``out_rest [r, row_bytes]`` (None when there are no rows after them)."""

    view: Tensor
    view_pages: Tensor
    out_pages: Tensor
    out_rest: Tensor | None


def _parts(views: Sequence[Tensor], index: PackIndex, block: Tensor) -> Iterator[_Part]:
    """Each view and its part of ``block``.

    NOTE: a sender packs a piece of a few pages per layer and pool tensor, hundreds of calls
    a layer at 128K; each tensor op here costs microseconds of host time, as much as the
    copy it sets up (docs/pd.md), so a part is cut with as few as it takes.
    """
    num_pages, ps = int(index.pages.shape[0]), index.page_size
    num_rest = int(index.rest.shape[0])
    offset = 0
    for view in views:
        width = view.shape[1]
        split = offset + num_pages * ps * width
        end = split + num_rest * width
        yield _Part(
            view,
            by_page(view, ps),
            block[offset:split].view(num_pages, ps * width),
            block[split:end].view(num_rest, width) if num_rest else None,
        )
        offset = end
    assert offset == block.numel(), f"block of {block.numel()} bytes, {offset} in its rows"
