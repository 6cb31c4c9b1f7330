"""The decode server of a PD run in a process of its own (``cpkv_core.pd.serve_decode``),
and the control round trips the prefill side makes to it."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from dataclasses import dataclass
from multiprocessing.connection import Client
from multiprocessing.process import BaseProcess

from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist import decode_frame
from cpkv_core.pd import (
    LOOPBACK,
    Message,
    Report,
    ReportReply,
    Shutdown,
    Started,
    WireError,
    call,
    serve_decode,
)


class DecodeServerError(RuntimeError):
    """The decode process could not start, or died."""


@dataclass
class DecodeProcess:
    """A decode server running in its own process, and how to talk to it."""

    process: BaseProcess
    address: tuple[str, int]
    session: str
    authkey: bytes

    def call(self, message: Message) -> Message | None:
        """One control round trip (a reply that is not a protocol frame is an error too)."""
        try:
            with Client(self.address, authkey=self.authkey) as conn:
                return call(conn, message)
        except (EOFError, OSError) as exc:
            code = self.process.exitcode
            raise DecodeServerError(
                f"decode server unreachable (exit code {code}): {exc!r}"
            ) from exc
        except WireError as exc:
            raise DecodeServerError(f"decode server sent a bad frame: {exc}") from exc

    def report(self) -> ReportReply:
        """Every request's state, rebuilt KV and decode step."""
        reply = self.call(Report())
        assert isinstance(reply, ReportReply), reply
        return reply

    def stop(self) -> None:
        """Shuts the server down (kills it if it does not exit)."""
        if self.process.is_alive():
            with contextlib.suppress(DecodeServerError):
                self.call(Shutdown())
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def start_decode(
    model: ModelConfig,
    deploy: DeploymentConfig,
    num_pages: int,
    timeout_s: float,
    die_on_done_of: str | None = None,
    host: str = LOOPBACK,
) -> DecodeProcess:
    """Starts a decode server process listening on ``host`` and waits until it listens."""
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    authkey = os.urandom(16)
    args = (model, deploy.page_size, deploy.index_k_dtype, num_pages, timeout_s, authkey, writer)
    process = ctx.Process(
        target=serve_decode,
        args=args,
        kwargs={"die_on_done_of": die_on_done_of, "host": host},
        daemon=True,
    )
    process.start()
    writer.close()  # NOTE: the child holds the only writer: its death reads as EOF
    with reader, contextlib.suppress(EOFError):
        if reader.poll(120):
            frame = reader.recv_bytes()
            address, session = decode_frame(frame, Started, "the decode server's address")
            return DecodeProcess(process, address, session, authkey)
    process.kill()
    raise DecodeServerError(f"decode server did not start (exit code {process.exitcode})")
