"""What a prefill group is told to do with PD, and what it reports back: the decode target,
its fault injection for drills, and each request's result per rank."""

from __future__ import annotations

from dataclasses import dataclass, field

from cpkv_core.pd.transport import LOOPBACK

BAD_ADDRESS_OFFSET = 1 << 40
"""Fault injection: added to destination addresses to make the engine reject a write."""

STAGING_BYTES = 64 << 20
"""Default bound of one write call: the staging buffer a rank packs pieces into."""

MIN_WRITE_BYTES = 4 << 20
"""Default bytes a rank queues before it writes (a request's final chunk writes at once)."""


@dataclass(frozen=True, slots=True)
class PdFaults:
    """Fault injection for tests and drills; applies to a request's first attempt only."""

    fail: tuple[str, int] | None = None
    """(rid, rank): that rank writes to an unregistered address, so the transfer fails."""
    stall: tuple[str, int] | None = None
    """(rid, rank): that rank writes but never reports, so the decode side times out."""


@dataclass(frozen=True, slots=True)
class PdTarget:
    """Where and how a prefill group sends its requests."""

    addresses: tuple[tuple[str, int], ...]
    """The control listener of every decode rank, in decode-rank order (one: a non-CP
    decode server)."""
    authkey: bytes
    rid_prefix: str = ""
    """Prepended to rids on the decode side (several runs can share one decode server)."""
    retries: int = 0
    """Attempts after a failed one."""
    faults: PdFaults = field(default_factory=PdFaults)
    staging_bytes: int = STAGING_BYTES
    """Bytes of one write call at most (at least one page of every layer)."""
    min_write_bytes: int = MIN_WRITE_BYTES
    """Queued bytes that trigger a write before any request's final chunk (0: write after
    every batch)."""
    probe: bool = False
    """After the trace, the ranks time the bench's baselines (``probe.time_baselines``): one
    large write of the trace's KV bytes by rank 0, and every rank writing its share at once."""
    local_host: str = LOOPBACK
    """This rank's address as the decode server reaches it (``--pd-local-host``): the
    host its transfer engine's session is named by."""
    overlap: bool = True
    """Writes run on a writer thread while the rank computes; False: synchronous, as before."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """How one request went from one rank."""

    rid: str
    rank: int
    ready: bool
    attempts: int
    bytes_sent: int
    released: bool
    """The rank freed the request's pages (only after the decode side's ack)."""
    errors: tuple[str, ...]
    write_batches: tuple[int, ...] = ()
    """The batch after which each piece of the last attempt was written (``AFTER_TRACE``
    for a retry's)."""
    bytes_by_dest: tuple[int, ...] = ()
    """``bytes_sent`` by decode rank."""


AFTER_TRACE = -1
"""``SendResult.write_batches`` of a write sent after the trace (a retry)."""
