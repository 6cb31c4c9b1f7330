"""The PD transport: Mooncake Transfer Engine, TCP on loopback here, RDMA in production.

The only module that imports ``mooncake``. Memory is registered once per pool tensor; a
transfer writes a batch of (source address, destination address, length) triples into the
peer's registered memory and returns when they have landed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

LOOPBACK = "127.0.0.1"
"""The default PD host (``--pd-host``, ``--pd-local-host``): one machine, nothing exposed."""
LOG_DIR_ENV = "CPKV_TRANSFER_LOG_DIR"
"""Where the engine's native logs go (default: the system temp dir)."""


def _redirect_native_logs() -> None:
    """Sends this process's native stderr to ``cpkv-transfer-<pid>.log``.

    The engine logs every session through glog before any flag can quiet it, straight to
    file descriptor 2; only processes that start an engine (decode server, prefill ranks)
    call this, and Python errors still reach the parent through the spawn harness.
    """
    log_dir = os.environ.get(LOG_DIR_ENV) or tempfile.gettempdir()
    path = os.path.join(log_dir, f"cpkv-transfer-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


class TransferError(RuntimeError):
    """A transfer-engine call failed; the message names what and where."""


@dataclass(frozen=True, slots=True)
class Write:
    """One contiguous write into the peer's registered memory."""

    src: int
    dst: int
    length: int


class Transport:
    """One process's transfer engine (``P2PHANDSHAKE``: no metadata server)."""

    def __init__(self, host: str = LOOPBACK, protocol: str = "tcp") -> None:
        """Starts the engine; peers reach it as ``host:rpc_port`` (``session``).

        Args:
            host: This process's address or host name as peers reach it (never a wildcard).
            protocol: ``tcp`` here, ``rdma`` in production.
        """
        _redirect_native_logs()
        from mooncake.engine import TransferEngine

        self._engine = TransferEngine()
        rc = self._engine.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise TransferError(f"transfer engine failed to start on {host} ({protocol}): rc={rc}")
        self.session = f"{host}:{self._engine.get_rpc_port()}"
        """What peers name this engine by."""
        self._registered: list[int] = []

    def register(self, tensors: Sequence[Tensor]) -> None:
        """Registers the memory of ``tensors`` (contiguous) for transfers."""
        for tensor in tensors:
            if not tensor.is_contiguous():
                raise TransferError("only contiguous tensors can be registered")
            address = tensor.data_ptr()
            rc = self._engine.register_memory(address, tensor.numel() * tensor.element_size())
            if rc != 0:
                raise TransferError(f"registering {tensor.numel()} elements failed: rc={rc}")
            self._registered.append(address)

    def write(self, session: str, writes: Sequence[Write]) -> None:
        """Writes every piece into ``session``'s registered memory; returns once they landed.

        Raises:
            TransferError: the engine reported a failure (peer down, bad address).
        """
        if not writes:
            return
        rc = self._engine.batch_transfer_sync_write(
            session, [w.src for w in writes], [w.dst for w in writes], [w.length for w in writes]
        )
        if rc != 0:
            total = sum(w.length for w in writes)
            raise TransferError(
                f"write of {len(writes)} pieces ({total} bytes) to {session} failed"
            )

    def close(self) -> None:
        """Unregisters every registered buffer."""
        for address in self._registered:
            self._engine.unregister_memory(address)
        self._registered.clear()
