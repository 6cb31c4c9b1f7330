"""The bench's baselines: large-buffer writes to the decode server over the same transport.

``cpkv bench`` divides the PD send path's throughput by one large write's, measured in the
same run and on the same engines: one ``batch_transfer_sync_write`` of one registered buffer
into a scratch buffer the decode server registers for it. Next to it, every rank of the
group writes its share of the same bytes in one call at once: the most any sender could get
from this transport with ``cp_size`` writers on this machine (its ceiling).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Client

import torch

from cpkv_core.pd.protocol import Probe, ProbeEnd, ProbeReply
from cpkv_core.pd.staging import process_transport
from cpkv_core.pd.target import PdTarget
from cpkv_core.pd.transport import Transport, Write
from cpkv_core.pd.wire import call


@dataclass(frozen=True, slots=True)
class LargeWrite:
    """One large write's size and its median time."""

    nbytes: int
    seconds: float
    """Median over the repeats, after one warm-up write."""


@dataclass(frozen=True, slots=True)
class ConcurrentWrite:
    """One rank's part of the group's concurrent writes (the ceiling)."""

    nbytes: int
    """This rank's share, written in one call each repeat."""
    spans: tuple[tuple[float, float], ...]
    """(start, end) ``time.perf_counter`` of each timed repeat (the warm-up left out): one
    clock for every process of a host, so the group's spans can be merged per repeat."""


@contextlib.contextmanager
def _probe_write(target: PdTarget, nbytes: int, dest: int) -> Iterator[tuple[str, Write]]:
    """A write of ``nbytes`` from a registered source into a scratch buffer decode rank
    ``dest`` registers for it: (the rank's session, the write); both freed on exit."""
    transport = process_transport(target.local_host)
    source = torch.full((nbytes,), 7, dtype=torch.uint8)
    transport.register([source])
    try:
        with Client(target.addresses[dest], authkey=target.authkey) as conn:
            reply = call(conn, Probe(nbytes))
            assert isinstance(reply, ProbeReply), reply
            try:
                yield reply.session, Write(source.data_ptr(), reply.address, nbytes)
            finally:
                call(conn, ProbeEnd(reply.address))
    finally:
        transport.unregister(source)


def _timed_write(transport: Transport, session: str, write: Write) -> tuple[float, float]:
    """(start, end) ``time.perf_counter`` of one write call."""
    began = time.perf_counter()
    transport.write(session, [write])
    return began, time.perf_counter()


def time_baselines(
    target: PdTarget,
    total_bytes: int,
    rank: int,
    world_size: int,
    barrier: Callable[[], None],
    repeats: int = 5,
) -> tuple[LargeWrite | None, ConcurrentWrite]:
    """Every rank of the group calls this at once. Each round, rank 0 writes all
    ``total_bytes`` in one call while the others wait, and every rank writes its share in
    one call, at once; the two take turns going first (a write right after another is
    slower). Interleaved, both baselines see the same machine; one warm-up round, then
    ``repeats`` timed ones. The large write goes to decode rank 0; prefill rank ``r``'s
    share to decode rank ``r % dcp_size``.

    Returns:
        (rank 0's large write, None on other ranks; this rank's concurrent writes).
    """
    transport = process_transport(target.local_host)
    share = -(-total_bytes // world_size)
    large: list[float] = []
    spans: list[tuple[float, float]] = []
    with contextlib.ExitStack() as stack:
        dest = rank % len(target.addresses)
        session, concurrent = stack.enter_context(_probe_write(target, share, dest))
        big = stack.enter_context(_probe_write(target, total_bytes, 0)) if rank == 0 else None
        for round_ in range(2 * (repeats + 1)):
            barrier()
            if round_ % 4 in (0, 3):
                if big is not None:
                    began, end = _timed_write(transport, *big)
                    large.append(end - began)
            else:
                spans.append(_timed_write(transport, session, concurrent))
    one = LargeWrite(total_bytes, statistics.median(large[1:])) if rank == 0 else None
    return one, ConcurrentWrite(share, tuple(spans[1:]))


class ProbeScratch:
    """The decode side of the baselines: one registered scratch buffer per ``Probe``, freed
    by its ``ProbeEnd`` (a mixin of the decode server, which owns ``transport``)."""

    transport: Transport

    def __init__(self) -> None:
        self.probes: dict[int, torch.Tensor] = {}
        """Scratch buffers of ``Probe`` by address (bench only)."""
        self._probes_lock = threading.Lock()

    def _on_probe(self, msg: Probe) -> ProbeReply:
        scratch = torch.zeros(msg.nbytes, dtype=torch.uint8)
        self.transport.register([scratch])
        with self._probes_lock:
            self.probes[scratch.data_ptr()] = scratch
        return ProbeReply(self.transport.session, scratch.data_ptr())

    def close_probes(self) -> None:
        """Unregisters every scratch buffer still held."""
        with self._probes_lock:
            scratches, self.probes = list(self.probes.values()), {}
        for scratch in scratches:
            self.transport.unregister(scratch)

    def _on_probe_end(self, msg: ProbeEnd) -> None:
        with self._probes_lock:
            scratch = self.probes.pop(msg.address, None)
        if scratch is not None:
            self.transport.unregister(scratch)
