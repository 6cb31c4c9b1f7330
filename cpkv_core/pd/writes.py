"""What a prefill rank writes and what its writes cost: a queued piece (``Outgoing``), the
rank's ``WriteStats``, and descriptors merged where they continue each other."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cpkv_core.pd.protocol import Piece
from cpkv_core.pd.transport import Write
from cpkv_core.planning.pd_pack import PageRuns
from cpkv_core.planning.pd_reshard import merge_runs


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One piece waiting to be written."""

    rid: str
    rows: PageRuns
    """The sender pool's rows, in block order (``len``: its tokens)."""
    dst: int
    """Destination address in the decode server's receive slab."""
    session: str
    piece: Piece
    dest: int = 0
    """The decode rank the piece goes to."""


@dataclass(slots=True)
class WriteStats:
    """What one rank's writes cost over a run."""

    calls: int = 0
    """``batch_transfer_sync_write`` calls (a failed call's one-by-one retries included)."""
    descriptors: int = 0
    """(source, destination, length) entries those calls carried, after merging."""
    seconds: float = 0.0
    """Packing plus writing, summed (on whichever thread did them)."""
    exposed_seconds: float = 0.0
    """Time the calling (prefill) thread spent in the send path: packing, waiting for a free
    staging buffer and the final drain. With overlap off it equals ``seconds``."""
    drain_seconds: float = 0.0
    """The part of ``exposed_seconds`` spent waiting for the writer thread to drain (in
    ``finish``: the trace's last write has no batch after it to hide behind)."""
    bytes: int = 0
    """Bytes that landed."""
    spans: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) ``time.perf_counter`` of every write call group (one per staging buffer
    filled): one clock for every process of a host, so the spans of a group's ranks can be
    merged. Packing is outside them."""
    flush_bytes: list[int] = field(default_factory=list)
    """Bytes that landed in each write, in the order of ``spans``."""
    loop_seconds: float = 0.0
    """The rank's run as its sender saw it: from the sender's creation (first batch) to the
    end of ``finish`` (every verdict in)."""


def merge_writes(writes: Sequence[Write]) -> list[Write]:
    """``writes`` with every run that continues in source and destination as one write."""
    starts, _, lengths = merge_runs(
        np.asarray([w.src for w in writes], dtype=np.int64),
        np.asarray([w.dst for w in writes], dtype=np.int64),
        np.asarray([w.length for w in writes], dtype=np.int64),
    )
    return [
        Write(writes[start].src, writes[start].dst, int(length))
        for start, length in zip(starts.tolist(), lengths, strict=True)
    ]
