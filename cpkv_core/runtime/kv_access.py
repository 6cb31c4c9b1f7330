"""The run steps of KV writes and reads: gathers and scatters with host-planned indices.

Nothing here reads a tensor's values to decide a shape: no ``.item()``, ``.tolist()``,
``nonzero``, boolean-mask indexing or ``unique``, so every function runs on the ``meta``
device (a test proves it) and is safe to capture in a CUDA graph.
"""

from __future__ import annotations

from torch import Tensor

from cpkv_core.dist.comm import Communicator
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.runtime.layout import KeySource, ReadPlan, WritePlan

MATERIALIZE_TAG = "materialize"
"""Collective tag of full-view materialization, so its bytes are counted apart."""


def write_current(pool: PagedKVPool, layer: int, plan: WritePlan, current: KVRows) -> None:
    """Stores the planned rows of the gathered current chunk into this rank's pool.

    Replicated: every row at its logical loc. Owner-filtered: only owned rows, at their
    physical rows.
    """
    pool.write(layer, plan.dest_rows, current.select(plan.source_index))


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


def key_source(
    comm: Communicator, pool: PagedKVPool, layer: int, plan: ReadPlan, current: KVRows
) -> KVRows:
    """The buffer this batch's keys are read from, by the plan's source."""
    if plan.source is KeySource.POOL:
        return pool.layers[layer]
    if plan.source is KeySource.CURRENT:
        return current
    assert plan.send_rows is not None, "a view read plan carries its send rows"
    return materialize(comm, pool.layers[layer], plan.send_rows)
