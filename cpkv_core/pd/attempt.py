"""One attempt to move a request, on both sides: the decode server's :class:`Attempt` (pending,
ready once every sender's pieces landed and check out, or failed: a retry is a new attempt
on fresh pages) and a prefill rank's :class:`SendAttempt`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cpkv_core.pd.protocol import AllocReply, Piece


class AttemptState(StrEnum):
    """Where one transfer attempt stands."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


@dataclass(slots=True)
class Attempt:
    """One attempt to receive a request; ``done`` maps rank -> the pieces it reported."""

    rid: str
    attempt: int
    seq_len: int
    next_token: int
    senders: int
    pages: int
    deadline: float | None = None
    """When the attempt fails unless ready: ``timeout_s`` after the first sender settled.
    Streaming senders allocate at a request's first chunk, so the clock waits for one of
    them to finish rather than running through the prefill."""
    state: AttemptState = AttemptState.PENDING
    reason: str = ""
    done: dict[int, tuple[Piece, ...]] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    """Senders that can no longer write into this attempt's pages (Done, Fail or Await)."""
    released: bool = False

    @property
    def key(self) -> str:
        """The attempt's name in the decode allocator: a retry never reuses its pages."""
        return f"{self.rid}#{self.attempt}"


@dataclass(slots=True)
class SendAttempt:
    """One rank's side of one attempt of one request, towards every decode rank.

    Threads: ``number`` and ``replies`` never change; ``cursors`` and ``sent_upto`` belong
    to the rank's thread; ``pieces``, ``bytes_by_dest``, ``write_batches`` and ``failed``
    are written only by the writer (the writer thread, or the rank's thread with overlap
    off), and the rank's thread reads them only after draining the writer (``failed`` also
    before, as a hint: a stale read only queues pieces the writer then skips).
    """

    number: int
    replies: tuple[AllocReply, ...] | None
    """Each decode rank's pages and slab; None when a decode rank refused pages."""
    cursors: tuple[int, ...]
    """Bytes every prefill rank's pieces filled so far of each decode rank's slab."""
    sent_upto: int = 0
    """Positions ``0..sent_upto-1`` are packed (by their owners)."""
    pieces: list[list[Piece]] = field(default_factory=list)
    """The pieces that landed, per decode rank."""
    bytes_by_dest: list[int] = field(default_factory=list)
    """Bytes that landed, per decode rank."""
    write_batches: list[int] = field(default_factory=list)
    failed: bool = False
    """This rank's write failed and it sent ``Fail``."""

    @classmethod
    def start(cls, number: int, replies: tuple[AllocReply, ...] | None, dests: int) -> SendAttempt:
        """A fresh attempt towards ``dests`` decode ranks."""
        return cls(
            number,
            replies,
            (0,) * dests,
            pieces=[[] for _ in range(dests)],
            bytes_by_dest=[0] * dests,
        )

    @property
    def bytes_sent(self) -> int:
        """Bytes that landed on every decode rank together."""
        return sum(self.bytes_by_dest)
