"""Key buffers ``[history view ; current rows]`` of one batch, layer by layer, optionally
fetched one layer ahead.

History pages were committed in earlier batches, so a layer's history view does not depend
on this batch's compute: it can be fetched before the layer runs. Each layer's key buffer
holds the history view (gathered from the owners with a padded all-gather, or read from
their mapped pools under peer-read) followed by the current chunk's gathered rows.

With ``prefetch`` two key buffers alternate (layer ``l`` uses buffer ``l % 2``): once layer
``l``'s view is ready, layer ``l + 1``'s fetch starts, so it runs while layer ``l`` attends
and layer ``l + 1`` projects, gathers its current chunk and writes. On gloo the fetch is an
``async_op=True`` all-gather; on CUDA it is issued on a side stream the main stream waits
for; an in-process group completes it eagerly. Without prefetch one buffer serves every
layer and each fetch runs when the layer reads. Sizes come from the host plan and no value
is read on the host, so this runs on ``meta`` too.

``exposed_seconds`` is the host time spent materializing that no compute overlapped: the
fetch's launch (its send-row selection) and the wait for it, plus the copy of the current
rows. On CUDA the host times launches only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.dist.comm import Communicator, GatherHandle
from cpkv_core.planning.host_plan import HostPlan, KeySource
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.kv_access import MATERIALIZE_TAG
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, by_page

__all__ = ["HistoryViews"]

_FIELDS = ("latent", "index_k", "index_k_scale")


def _raw(t: Tensor) -> Tensor:
    """Float8 as its bytes (no float8 kernels for ``index_select(out=)`` and copies)."""
    return t.view(torch.uint8) if t.dtype.is_floating_point and t.dtype.itemsize == 1 else t


@dataclass(slots=True)
class _Fetch:
    handles: list[GatherHandle]
    event: torch.cuda.Event | None


class HistoryViews:
    """The key buffers of one batch on one rank; see the module docstring.

    Invariant: ``keys(l)`` is called for ``l = 0, 1, ...`` in order, the same on every rank
    (the fetches are collectives under gather).
    """

    def __init__(
        self,
        comm: Communicator,
        pool: PagedKVPool,
        host: HostPlan,
        tensors: BatchTensors,
        peers: Sequence[Sequence[KVRows]],
        prefetch: bool,
        tag: str,
    ) -> None:
        self.comm, self.pool, self.host, self.tensors = comm, pool, host, tensors
        self.peers, self.prefetch, self.tag = peers, prefetch, tag
        self.history = host.history_tokens
        self.device = pool.layers[0].latent.device
        self.side = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if prefetch and self.device.type == "cuda"
            else None
        )
        self.buffers: list[KVRows | None] = [None, None]
        self.pending: dict[int, _Fetch] = {}
        self.exposed_seconds = 0.0

    @classmethod
    def open(
        cls,
        comm: Communicator,
        pool: PagedKVPool,
        host: HostPlan,
        tensors: BatchTensors,
        peers: Sequence[Sequence[KVRows]],
        prefetch: bool,
    ) -> HistoryViews | None:
        """The views of a ``history+current`` read (layer 0's fetch started when
        ``prefetch``), counted under ``materialize``; None for any other key source."""
        if host.key_source is not KeySource.HISTORY_AND_CURRENT:
            return None
        views = cls(comm, pool, host, tensors, peers, prefetch, MATERIALIZE_TAG)
        if prefetch:
            views.start(0)
        return views

    def _buffer(self, layer: int) -> KVRows:
        slot = layer % 2 if self.prefetch else 0
        buffer = self.buffers[slot]
        if buffer is None:
            like = self.pool.layers[0]
            n = self.history + self.host.num_tokens
            buffer = KVRows(
                *(getattr(like, f).new_empty((n, *getattr(like, f).shape[1:])) for f in _FIELDS)
            )
            self.buffers[slot] = buffer
        return buffer

    def _gather_into(self, layer: int, buffer: KVRows) -> list[GatherHandle]:
        """The owners' padded slots of ``layer``, all-gathered into the buffer's head."""
        local = self.pool.layers[layer].select_pages(self.tensors.send_pages, self.pool.page_size)
        handles = []
        for f in _FIELDS:
            part: Tensor = getattr(buffer, f)[: self.history]
            out = part.view(self.comm.world_size, -1, *part.shape[1:])
            handles.append(self.comm.all_gather_async(getattr(local, f), self.tag, out))
        return handles

    def _read_peers_into(self, layer: int, buffer: KVRows) -> None:
        """The owners' history pages of ``layer``, read from their mapped pools page by
        page."""
        view = self.host.peer_view
        assert view is not None, "a peer read plans a peer view"
        ps, pages = view.page_size, self.tensors.send_pages
        for f in _FIELDS:
            out = _raw(getattr(buffer, f))
            for owner, ranks_layers in enumerate(self.peers):
                start, end = view.owner_rows[owner], view.owner_rows[owner + 1]
                assert start % ps == end % ps == 0, f"owner {owner} rows {start}:{end}"
                source = by_page(_raw(getattr(ranks_layers[layer], f)), ps)
                into = by_page(out[start:end], ps)
                torch.index_select(source, 0, pages[start // ps : end // ps], out=into)

    def start(self, layer: int) -> None:
        """Starts fetching ``layer``'s history view (no-op past the last layer or when
        already started)."""
        if layer >= len(self.pool.layers) or layer in self.pending:
            return
        began = time.perf_counter()
        buffer = self._buffer(layer)
        stream = self.side
        if stream is not None:
            # NOTE: the buffer was last read two layers ago on the main stream.
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            handles: list[GatherHandle] = []
            if self.history and self.peers:
                self._read_peers_into(layer, buffer)
            elif self.history:
                handles = self._gather_into(layer, buffer)
            event = torch.cuda.Event() if stream is not None else None  # type: ignore[no-untyped-call]
            if event is not None:
                event.record(stream)
        self.pending[layer] = _Fetch(handles, event)
        self.exposed_seconds += time.perf_counter() - began

    def keys(self, layer: int, current: KVRows) -> KVRows:
        """``[history view ; current rows]`` of ``layer``; starts ``layer + 1``'s fetch
        under prefetch."""
        self.start(layer)
        began = time.perf_counter()
        fetch = self.pending.pop(layer)
        for handle in fetch.handles:
            handle.wait()
        if fetch.event is not None:
            torch.cuda.current_stream(self.device).wait_event(fetch.event)
        buffer = self._buffer(layer)
        for f in _FIELDS:
            _raw(getattr(buffer, f))[self.history :].copy_(_raw(getattr(current, f)))
        self.exposed_seconds += time.perf_counter() - began
        if self.prefetch:
            self.start(layer + 1)
        return buffer
