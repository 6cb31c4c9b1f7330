"""PD packing, the tensor side: gather a piece's token rows into a staging block, and
scatter a received block into the decode pool.

A block holds, for every layer and every pool tensor (latent KV, index K, index K scale),
the piece's ``[tokens, row_bytes]`` rows as raw bytes, one after the other. The row lists
come from ``cpkv_core.planning.pd_pack``; here is one ``index_select`` per layer and tensor
(into the staging buffer, no copy in between on the same device) and one ``index_copy_``
per layer and tensor on the decode side.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cpkv_core.runtime.kv_pool import PagedKVPool


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


def pack_rows(views: Sequence[Tensor], rows: Tensor, block: Tensor) -> None:
    """Gathers token ``rows [n]`` of every view into ``block [n * token_bytes]`` (uint8).

    On the views' device the gather writes straight into ``block``; from another device it
    gathers there and copies once.
    """
    n = int(rows.shape[0])
    offset = 0
    for view in views:
        width = int(view.shape[1])
        out = block[offset : offset + n * width].view(n, width)
        if out.device == view.device:
            torch.index_select(view, 0, rows, out=out)
        else:
            out.copy_(view.index_select(0, rows.to(view.device)))
        offset += n * width
    assert offset == block.numel(), f"block of {block.numel()} bytes, packed {offset}"


def unpack_rows(views: Sequence[Tensor], rows: Tensor, block: Tensor) -> None:
    """Scatters ``block [n * token_bytes]`` (as packed by ``pack_rows``) into token ``rows
    [n]`` of every view."""
    n = int(rows.shape[0])
    offset = 0
    for view in views:
        width = int(view.shape[1])
        view.index_copy_(0, rows, block[offset : offset + n * width].view(n, width))
        offset += n * width
    assert offset == block.numel(), f"block of {block.numel()} bytes, unpacked {offset}"
