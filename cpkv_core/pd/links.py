"""A prefill rank's control connections to every rank of a decode group, and the handshake
it makes on them before anything else (``handshake``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection

from cpkv_core.pd.layout import layout_mismatch
from cpkv_core.pd.protocol import Hello, HelloReply, PdLayout
from cpkv_core.pd.wire import Message, call


class DecodeLinks:
    """One authenticated connection per decode rank (in rank order), one round trip at a
    time over all of them (one lock, shared by the rank's thread and its writer thread),
    and why the decode group became unreachable, once it did."""

    def __init__(self, addresses: Sequence[tuple[str, int]], authkey: bytes) -> None:
        self.size = len(addresses)
        self.conns: list[Connection] = []
        self.broken: str | None = None
        """Why the decode group became unreachable (set by either thread, first one wins)."""
        self._lock = threading.Lock()
        try:
            for address in addresses:
                self.conns.append(Client(address, authkey=authkey))
        except OSError as exc:
            self.break_(exc)

    def call(self, dest: int, message: Message) -> Message | None:
        """One round trip with decode rank ``dest``, from either thread.

        Raises:
            OSError, EOFError: the connection is down (or was never made).
        """
        with self._lock:
            if len(self.conns) < self.size:
                raise OSError(f"no connection to the decode server: {self.broken}")
            return call(self.conns[dest], message)

    def break_(self, exc: BaseException) -> None:
        """The decode group is unreachable: the first thread to see it says why."""
        with self._lock:
            if self.broken is None:
                self.broken = repr(exc)

    def close(self) -> None:
        """Closes every connection."""
        for conn in self.conns:
            conn.close()


def handshake(links: DecodeLinks, rank: int, layout: PdLayout) -> str:
    """Exchanges layouts with every decode rank before any page moves (each of them, so
    every decode rank learns of a mismatch); returns why the transfer is refused (the first
    refusal, both layouts named), or "" when every rank agrees.

    Raises:
        OSError, EOFError: a decode rank is unreachable.
    """
    refusals = []
    for dest in range(links.size):
        reply = links.call(dest, Hello(rank, layout))
        if not isinstance(reply, HelloReply):
            refusals.append(f"decode rank {dest} answered the handshake with {reply}")
        elif reply.dcp_rank != dest:
            refusals.append(f"address {dest} of the decode group is decode rank {reply.dcp_rank}")
        else:
            refusals.append(reply.refused or layout_mismatch(layout, reply.layout, dest))
    return next((r for r in refusals if r), "")
