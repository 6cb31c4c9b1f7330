"""This process's transfer engine and registered staging buffers: started and registered
once, reused by every sender, request and run of the process."""

from __future__ import annotations

import torch
from torch import Tensor

from cpkv_core.pd.transport import LOOPBACK, Transport

_transport: Transport | None = None
_staging: tuple[Tensor, ...] = ()


def process_transport(host: str = LOOPBACK) -> Transport:
    """This process's transfer engine on ``host``, started on first use.

    Raises:
        RuntimeError: the engine already runs on another host (one engine a process).
    """
    global _transport
    if _transport is None:
        _transport = Transport(host)
    if not _transport.session.startswith(f"{host}:"):
        raise RuntimeError(
            f"this process's transfer engine runs as {_transport.session}, not on {host}"
        )
    return _transport


STAGING_BUFFERS = 2
"""Staging buffers a rank packs into: one fills while the other's write is in flight."""


def process_staging(nbytes: int, host: str = LOOPBACK) -> tuple[Tensor, ...]:
    """This process's ``STAGING_BUFFERS`` registered staging buffers of at least ``nbytes``
    each (registered once, reused by every request and run; replaced only by a larger
    request)."""
    global _staging
    if not _staging or _staging[0].numel() < nbytes:
        transport = process_transport(host)
        for buffer in _staging:
            transport.unregister(buffer)
        _staging = tuple(torch.empty(nbytes, dtype=torch.uint8) for _ in range(STAGING_BUFFERS))
        transport.register(list(_staging))
    return _staging
