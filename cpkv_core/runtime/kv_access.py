"""The run steps of KV writes and reads: gathers and scatters with device-expanded indices.

Nothing here reads a tensor's values to decide a shape: no ``.item()``, ``.tolist()``,
``nonzero``, boolean-mask indexing or ``unique``, so every function runs on the ``meta``
device (a test proves it) and is safe to capture in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import Tensor

from cpkv_core.dist.comm import Communicator
from cpkv_core.planning.host_plan import KeySource
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool

MATERIALIZE_TAG = "materialize"
"""Collective tag of full-view materialization, so its bytes are counted apart."""


def write_rows(pool: PagedKVPool, layer: int, source: KVRows, rows: Tensor, dest: Tensor) -> None:
    """Stores ``source``'s rows ``rows [m]`` at pool rows ``dest [m]`` of ``layer``.

    Replicated: every gathered row at its logical loc. Owner-filtered: only owned rows of
    the gathered chunk, at their physical rows. Direct: this rank's own rows.
    """
    pool.write(layer, dest, source.select(rows))


def materialize(comm: Communicator, pool_layer: KVRows, send_rows: Tensor) -> KVRows:
    """Gathers the pages a batch reads from their owners into one dense view.

    Args:
        pool_layer: this rank's pool for one layer.
        send_rows: ``[max_pages * page_size]`` pool rows this rank sends into its slots.

    Returns:
        The view, ``[cp_size * max_pages * page_size, ...]`` token rows.
    """
    local = pool_layer.select(send_rows)
    return KVRows(
        comm.all_gather(local.latent, MATERIALIZE_TAG).flatten(0, 1),
        comm.all_gather(local.index_k, MATERIALIZE_TAG).flatten(0, 1),
        comm.all_gather(local.index_k_scale, MATERIALIZE_TAG).flatten(0, 1),
    )


def _read_into(out: Tensor, parts: Sequence[tuple[Tensor, Tensor]], current: Tensor) -> Tensor:
    """Fills ``out`` with each ``(source, rows)`` selection in turn, then ``current``."""
    start = 0
    for source, rows in parts:
        end = start + int(rows.shape[0])
        torch.index_select(source, 0, rows, out=out[start:end])
        start = end
    out[start:].copy_(current)
    return out


def peer_read_view(
    peer_layers: Sequence[KVRows], read_rows: Tensor, owner_rows: Sequence[int], current: KVRows
) -> KVRows:
    """``[history view ; current rows]``: each owner's history rows read straight from its
    mapped pool (no collective, no padding), then the gathered current chunk.

    Args:
        peer_layers: every rank's pool for one layer, as this rank maps it.
        read_rows: ``[history_tokens]`` owners' pool rows, owner by owner, in view order.
        owner_rows: ``[cp_size + 1]`` host bounds of each owner's rows in ``read_rows``.
        current: ``[num_tokens, ...]`` the current chunk in batch order.

    Returns:
        ``[history_tokens + num_tokens, ...]`` token rows.
    """
    rows = [read_rows[a:b] for a, b in pairwise(owner_rows)]
    n = owner_rows[-1] + len(current)

    def part(name: str) -> Tensor:
        like: Tensor = getattr(current, name)
        # NOTE: float8 has no index_select with out=; its bytes are copied instead.
        raw = like.dtype.itemsize == 1 and like.dtype.is_floating_point

        def as_bytes(t: Tensor) -> Tensor:
            return t.view(torch.uint8) if raw else t

        out = as_bytes(like.new_empty((n, *like.shape[1:])))
        sources = [as_bytes(getattr(layer, name)) for layer in peer_layers]
        filled = _read_into(out, list(zip(sources, rows, strict=True)), as_bytes(like))
        return filled.view(like.dtype) if raw else filled

    return KVRows(part("latent"), part("index_k"), part("index_k_scale"))


def key_source(
    comm: Communicator,
    pool: PagedKVPool,
    layer: int,
    source: KeySource,
    send_rows: Tensor,
    current: KVRows,
    peers: Sequence[Sequence[KVRows]] = (),
    owner_rows: Sequence[int] = (),
) -> KVRows:
    """The buffer this batch's keys are read from, by the plan's source; ``peers`` (every
    rank's pool layers as mapped here) and ``owner_rows`` serve a peer read."""
    if source is KeySource.POOL:
        return pool.layers[layer]
    if source is KeySource.CURRENT:
        return current
    if source is KeySource.HISTORY_AND_CURRENT:
        if not peers:
            raise RuntimeError("a peer-read plan on an engine without shared pools, a bug")
        layers = [rank_layers[layer] for rank_layers in peers]
        return peer_read_view(layers, send_rows, owner_rows, current)
    return materialize(comm, pool.layers[layer], send_rows)
