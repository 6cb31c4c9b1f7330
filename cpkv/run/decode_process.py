"""The decode group of a PD run: ``dcp_size`` decode ranks, each a process of its own with its
control listener and transfer engine, spawned as one gloo group (``dist.spawn_group``, on a
thread of this process, for the decode step's merge); and the control round trips the run
makes to them."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Client

from cpkv_core.dist import ProgressEvent, spawn_group
from cpkv_core.pd import (
    LOOPBACK,
    DecodeSpec,
    DecodeStarted,
    Message,
    Report,
    ReportReply,
    Shutdown,
    WireError,
    call,
    serve_decode_rank,
)

START_TIMEOUT_S = 120.0
"""Seconds every decode rank has to start listening."""
GROUP_TIMEOUT_S = 3600.0
"""Seconds the decode group may live (every PD run of a bench or a test shares it)."""
STOP_TIMEOUT_S = 30.0
"""Seconds the ranks have to exit after ``Shutdown``."""


class DecodeServerError(RuntimeError):
    """The decode group could not start, or a rank died."""


@dataclass
class DecodeGroup:
    """A decode group running in processes of its own, and how to talk to it."""

    spec: DecodeSpec
    authkey: bytes
    ranks: list[DecodeStarted] = field(default_factory=list)
    """Where every decode rank listens, in rank order."""
    thread: threading.Thread | None = None
    failure: list[BaseException] = field(default_factory=list)
    """What the spawn group raised (a rank died, or did not start)."""

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every rank's control listener, in rank order."""
        return tuple(r.address for r in self.ranks)

    def _why(self) -> str:
        """What the spawn group said of a dead rank, once it noticed (a short wait)."""
        if self.thread is not None:
            self.thread.join(5.0)
        return f"{self.failure[0]}; " if self.failure else ""

    def call(self, rank: int, message: Message) -> Message | None:
        """One control round trip with decode rank ``rank`` (a reply that is not a protocol
        frame is an error too)."""
        try:
            with Client(self.ranks[rank].address, authkey=self.authkey) as conn:
                return call(conn, message)
        except (EOFError, OSError) as exc:
            raise DecodeServerError(
                f"decode server unreachable (decode rank {rank}: {self._why()}{exc!r})"
            ) from exc
        except WireError as exc:
            raise DecodeServerError(f"decode server sent a bad frame: {exc}") from exc

    def report(self) -> list[ReportReply]:
        """Every rank's report, asked of every rank at once (their decode steps merge)."""
        with ThreadPoolExecutor(len(self.ranks)) as pool:
            replies = list(pool.map(lambda r: self.call(r, Report()), range(len(self.ranks))))
        for rank, reply in enumerate(replies):
            if not isinstance(reply, ReportReply):
                raise DecodeServerError(f"decode rank {rank} answered Report with {reply}")
        return [r for r in replies if isinstance(r, ReportReply)]

    def stop(self) -> None:
        """Shuts every rank down; the spawn group then tears the processes down."""
        for rank in range(len(self.ranks)):
            with contextlib.suppress(DecodeServerError):
                self.call(rank, Shutdown())
        if self.thread is not None:
            self.thread.join(STOP_TIMEOUT_S)


def start_decode_group(
    spec: DecodeSpec, die_on_done_of: str | None = None, host: str = LOOPBACK
) -> DecodeGroup:
    """Starts ``spec.dcp_size`` decode ranks listening on ``host`` and waits until every one
    listens.

    Raises:
        DecodeServerError: a rank died or did not start in ``START_TIMEOUT_S``.
    """
    group = DecodeGroup(spec, os.urandom(16))
    started: dict[int, DecodeStarted] = {}
    listening = threading.Event()

    def on_progress(event: object) -> None:
        assert isinstance(event, ProgressEvent) and isinstance(event.message, DecodeStarted)
        started[event.message.dcp_rank] = event.message
        if len(started) == spec.dcp_size:
            listening.set()

    def run() -> None:
        try:
            spawn_group(
                spec.dcp_size,
                serve_decode_rank,
                (spec, group.authkey, die_on_done_of, host),
                timeout_s=GROUP_TIMEOUT_S,
                on_progress=on_progress,
                progress_type=DecodeStarted,
            )
        except BaseException as exc:  # NOTE: kept for the run's report, never lost
            group.failure.append(exc)
        finally:
            listening.set()

    group.thread = threading.Thread(target=run, name="cpkv-decode-group", daemon=True)
    group.thread.start()
    if not listening.wait(START_TIMEOUT_S) or len(started) < spec.dcp_size:
        reason = group.failure[0] if group.failure else "no answer"
        raise DecodeServerError(f"decode group of {spec.dcp_size} did not start: {reason}")
    group.ranks = [started[rank] for rank in range(spec.dcp_size)]
    return group
