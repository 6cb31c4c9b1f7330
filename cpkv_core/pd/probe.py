"""The bench's baseline: one large-buffer write to the decode server over the same transport.

``cpkv bench`` divides the PD send path's throughput by this one, measured in the same run
and on the same engines: one ``batch_transfer_sync_write`` of one registered buffer into a
scratch buffer the decode server registers for it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Client

import torch

from cpkv_core.pd.prefill import PdTarget, process_transport
from cpkv_core.pd.protocol import Probe, ProbeEnd, ProbeReply
from cpkv_core.pd.transport import Write
from cpkv_core.pd.wire import call


@dataclass(frozen=True, slots=True)
class LargeWrite:
    """One large write's size and its median time."""

    nbytes: int
    seconds: float
    """Median over the repeats, after one warm-up write."""


def time_large_write(target: PdTarget, nbytes: int, repeats: int = 3) -> LargeWrite:
    """Times one write of ``nbytes`` from a registered buffer into the decode server."""
    transport = process_transport(target.local_host)
    source = torch.full((nbytes,), 7, dtype=torch.uint8)
    transport.register([source])
    try:
        with Client(target.address, authkey=target.authkey) as conn:
            reply = call(conn, Probe(nbytes))
            assert isinstance(reply, ProbeReply), reply
            write = [Write(source.data_ptr(), reply.address, nbytes)]
            samples = []
            for _ in range(repeats + 1):
                began = time.perf_counter()
                transport.write(reply.session, write)
                samples.append(time.perf_counter() - began)
            call(conn, ProbeEnd(reply.address))
    finally:
        transport.unregister(source)
    return LargeWrite(nbytes, statistics.median(samples[1:]))
