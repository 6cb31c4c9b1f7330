"""The run steps of KV writes and reads: gathers and scatters with device-expanded indices.

Nothing here reads a tensor's values to decide a shape: no ``.item()``, ``.tolist()``,
``nonzero``, boolean-mask indexing or ``unique``, so every function runs on the ``meta``
device (a test proves it) and is safe to capture in a CUDA graph.
"""

from __future__ import annotations

from torch import Tensor

from cpkv_core.dist.comm import Communicator
from cpkv_core.planning.host_plan import KeySource
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool

MATERIALIZE_TAG = "materialize"
"""Collective tag of full-view materialization, so its bytes are counted apart."""


def write_rows(
    pool: PagedKVPool, layer: int, source: KVRows, rows: Tensor | None, dest: Tensor
) -> None:
    """Stores ``source``'s rows ``rows [m]`` at pool rows ``dest [m]`` of ``layer``; ``rows``
    None stores every row of ``source`` in order, with no gather first.

    Replicated: every gathered row at its logical loc. Owner-filtered: only owned rows of
    the gathered chunk, at their physical rows. Direct: this rank's own rows. The first and
    the last take every row of their source in order (``BatchTensors.write_source`` None).
    """
    pool.write(layer, dest, source if rows is None else source.select(rows))


def materialize(
    comm: Communicator, pool_layer: KVRows, send_pages: Tensor, page_size: int
) -> KVRows:
    """Gathers the pages a batch reads from their owners into one dense view.

    Args:
        pool_layer: this rank's pool for one layer.
        send_pages: ``[max_pages]`` pool pages this rank sends into its slots.

    Returns:
        The view, ``[cp_size * max_pages * page_size, ...]`` token rows.
    """
    local = pool_layer.select_pages(send_pages, page_size)
    return KVRows(
        comm.all_gather(local.latent, MATERIALIZE_TAG).flatten(0, 1),
        comm.all_gather(local.index_k, MATERIALIZE_TAG).flatten(0, 1),
        comm.all_gather(local.index_k_scale, MATERIALIZE_TAG).flatten(0, 1),
    )


def key_source(
    comm: Communicator,
    pool: PagedKVPool,
    layer: int,
    source: KeySource,
    send_pages: Tensor,
    current: KVRows,
) -> KVRows:
    """The buffer this batch's keys are read from, by the plan's source (a history view plus
    current rows is ``history_views.HistoryViews``'s)."""
    if source is KeySource.HISTORY_AND_CURRENT:
        raise RuntimeError("history+current keys come from HistoryViews, indicates a bug")
    if source is KeySource.POOL:
        return pool.layers[layer]
    if source is KeySource.CURRENT:
        return current
    return materialize(comm, pool.layers[layer], send_pages, pool.page_size)
