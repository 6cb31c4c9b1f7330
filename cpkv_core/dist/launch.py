"""Spawn harness: run one function on every rank of a real multi-process torch.distributed group.

``spawn_group(world_size, fn, args)`` starts ``world_size`` processes with the ``spawn``
start method, or forks them from a server process that imported the heavy modules once
(``preload``, or inside ``start_method.forked_ranks``), rendezvous them through a ``file://``
store in a fresh temporary directory, and calls ``fn(comm, *args)`` on each with a
``TorchDistCommunicator`` over the default group. Results come back in rank order. Any
failure, early exit or timeout tears every process down and raises ``RuntimeError`` naming
the rank, so a broken test never hangs.

A rank that stalls is named too: when a rank reports a ``CollectiveTimeout`` (its group's
collective timeout ran out), the ranks still running without a word are the ones it waited
for.

Nothing crosses as a pickle: ``fn`` goes by its module and name (it must be a module-level
function), and its arguments, every progress message, its result and an error each travel
as a typed frame (``frames.py``: JSON plus raw tensor bytes) through the rank's own pipe.
``fn``'s parameters after ``comm`` and its return are annotated with types the codec carries
(``codec.py``), and the parent decodes only those types: a rank (or whatever writes to its
pipe) cannot run code in the launcher. A rank that raises reports a ``RankError`` (its
exception chain as plain data); the parent raises ``RankFailed`` holding it. A child may
call ``report_progress(message)`` to stream progress to the parent's ``on_progress``.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol, TypeVar, cast

from cpkv_core.dist import comm as comm_mod
from cpkv_core.dist.rank_body import body_target, rank_signature
from cpkv_core.dist.rank_child import ERROR, PROGRESS, RESULT, ProgressEvent, child_main
from cpkv_core.dist.rank_child import progress_to as progress_to
from cpkv_core.dist.rank_child import report_progress as report_progress
from cpkv_core.dist.rank_errors import RankError, RankFailed
from cpkv_core.dist.start_method import rank_context
from cpkv_core.dist.typed.frames import FrameError, decode_frame, encode_frame

__all__ = [
    "ProgressEvent",
    "progress_to",
    "report_progress",
    "spawn_group",
]

T = TypeVar("T")

_POLL_S = 0.05
"""Seconds between checks for results, progress and dead children."""
_EXIT_GRACE_S = 2.0
"""Seconds to drain the pipes after a child died, in case its report is still in flight."""
_JOIN_S = 5.0
"""Seconds a child may take to exit after its result before it is terminated."""

class _Inbox(Protocol):
    """Where ``_collect`` reads the ranks' messages (the pipes, or a test's fake)."""

    def get(self, timeout: float) -> tuple[int, bytes, bytes]:
        """The next ``(rank, kind, frame)``; raises ``queue.Empty`` after ``timeout``."""
        ...


class _Pipes:
    """Every rank's pipe, read as one inbox (a closed pipe drops out)."""

    def __init__(self, readers: Sequence[Connection]) -> None:
        self.open = dict(enumerate(readers))

    def get(self, timeout: float) -> tuple[int, bytes, bytes]:
        if not self.open:
            time.sleep(timeout)
            raise queue_mod.Empty
        for ready in wait(list(self.open.values()), timeout):
            rank = next(r for r, conn in self.open.items() if conn is ready)
            try:
                message = cast(Connection, ready).recv_bytes()
            except (EOFError, OSError):
                self.open.pop(rank).close()  # NOTE: the rank exited; its pipe is done
                continue
            return rank, message[:1], message[1:]
        raise queue_mod.Empty

    def close(self) -> None:
        """Closes every pipe still open."""
        for conn in self.open.values():
            conn.close()


def _dead_peers(procs: Sequence[BaseProcess], done: dict[int, object], rank: int) -> list[str]:
    """Peers of a failed ``rank`` that died without a result, after a short grace.

    NOTE: a peer that dies makes the survivors' collectives fail, and the survivor's error
    can arrive before the parent sees the death; the dead rank is the one to name first.
    """
    grace_end = time.monotonic() + _EXIT_GRACE_S
    while True:
        dead = [
            f"rank {r} exited with code {p.exitcode}"
            for r, p in enumerate(procs)
            if r not in done and r != rank and p.exitcode not in (None, 0)
        ]
        if dead or time.monotonic() > grace_end:
            return dead
        time.sleep(_POLL_S)


def _stalled_peers(
    inbox: _Inbox, procs: Sequence[BaseProcess], done: dict[int, object], rank: int
) -> list[str]:
    """Peers still running with neither a result nor an error after ``rank``'s collective
    timed out: the ranks it waited for.

    NOTE: every rank waiting on a stalled one times out at about the same time; a short
    grace lets their reports arrive, so that only the silent ranks are named.
    """
    failed = {rank}
    grace_end = time.monotonic() + _EXIT_GRACE_S
    while time.monotonic() < grace_end:
        try:
            other, kind, _ = inbox.get(_POLL_S)
        except queue_mod.Empty:
            continue
        if kind != PROGRESS:
            failed.add(other)
    return [
        f"rank {r} stalled (still running, neither a result nor an error, when the others' "
        "collective timed out)"
        for r, p in enumerate(procs)
        if r not in done and r not in failed and p.exitcode is None
    ]


@dataclass(frozen=True, slots=True)
class _Expect:
    """What the parent decodes from its ranks: the result's and progress's annotations."""

    result: Any
    progress: Any = None
    on_progress: Callable[[object], None] | None = None


def _failure(
    inbox: _Inbox, procs: Sequence[BaseProcess], done: dict[int, object], rank: int, frame: bytes
) -> RankFailed:
    """The error ``rank`` reported, with the peers that died or stalled first."""
    error = cast(RankError, decode_frame(frame, RankError, f"rank {rank}'s error report"))
    if error.find(comm_mod.COLLECTIVE_TIMEOUT) is not None:
        culprits = _stalled_peers(inbox, procs, done, rank)
    else:
        culprits = [f"{d} before reporting a result" for d in _dead_peers(procs, done, rank)]
    return RankFailed(rank, error, culprits)


def _check_exits(procs: Sequence[BaseProcess], done: dict[int, object], since: list[float]) -> None:
    """Raises once a child exited without a result and the grace for its report ran out."""
    exited = [
        (r, p.exitcode) for r, p in enumerate(procs) if r not in done and p.exitcode is not None
    ]
    if not exited:
        return
    # NOTE: a child's report is flushed before it exits; the grace lets it arrive.
    now = time.monotonic()
    since[:] = since or [now]
    if now - since[0] > _EXIT_GRACE_S:
        r, code = exited[0]
        raise RuntimeError(f"rank {r} exited with code {code} before reporting a result")


def _collect(
    inbox: _Inbox, procs: Sequence[BaseProcess], timeout_s: float, expect: _Expect
) -> dict[int, object]:
    """Waits for one result per rank; raises RuntimeError on an error, a death or timeout,
    FrameError on a message that is not a typed frame of what it should hold."""
    deadline = time.monotonic() + timeout_s
    done: dict[int, object] = {}
    exited_since: list[float] = []
    while len(done) < len(procs):
        if time.monotonic() > deadline:
            missing = [r for r in range(len(procs)) if r not in done]
            raise RuntimeError(
                f"spawn_group timed out after {timeout_s:g} s; ranks without a result: {missing}"
            )
        _check_exits(procs, done, exited_since)
        try:
            rank, kind, frame = inbox.get(_POLL_S)
        except queue_mod.Empty:
            continue
        if kind == PROGRESS:
            if expect.on_progress is not None:
                message = decode_frame(frame, expect.progress, f"rank {rank}'s progress")
                expect.on_progress(ProgressEvent(rank, message))
        elif kind == ERROR:
            raise _failure(inbox, procs, done, rank, frame)
        elif kind == RESULT:
            done[rank] = decode_frame(frame, expect.result, f"rank {rank}'s result")
        else:
            raise FrameError(f"rank {rank} sent a message of unknown kind {kind!r}")
    return done


def _teardown(procs: Sequence[BaseProcess], graceful: bool) -> None:
    """Stops every child: after success lets them exit first; otherwise terminates at once.

    A child that ignores SIGTERM for ``_JOIN_S`` seconds is killed.
    """
    if graceful:
        deadline = time.monotonic() + _JOIN_S
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=_JOIN_S)
        if p.is_alive():
            p.kill()
            p.join()


def spawn_group(
    world_size: int,
    fn: Callable[..., T],
    args: tuple[object, ...] = (),
    backend: str = "gloo",
    timeout_s: float = 120.0,
    on_progress: Callable[[object], None] | None = None,
    progress_type: Any = None,
    preload: Sequence[str] = (),
) -> list[T]:
    """Runs ``fn(comm, *args)`` on every rank of a fresh ``world_size``-process group.

    Args:
        world_size: Processes to spawn (``>= 1``).
        fn: Module-level function ``fn(comm: Communicator, *args) -> T``, its parameters
            and return annotated with types the codec carries (``rank_signature``).
        args: Extra arguments, the same for every rank, of ``fn``'s annotated types.
        backend: torch.distributed backend (``"gloo"`` on CPU, ``"nccl"`` on CUDA).
        timeout_s: Limit for the whole run, start-up included (~3 s per process start);
            also the group's collective timeout.
        on_progress: Called in the parent with a ``ProgressEvent`` for every
            ``report_progress`` a child makes.
        progress_type: The class of the children's progress messages (with
            ``on_progress``).
        preload: Modules to import once in a fork server that forks every rank (the
            ``forkserver`` start method), instead of in each spawned rank: for modules that
            take seconds to import. The first call of the process fixes the list.

    Returns:
        Every rank's result, in rank order.

    Raises:
        ValueError: ``world_size < 1``, ``fn`` is not module-level, or ``on_progress``
            without ``progress_type``.
        TypeError: ``fn``'s annotations are missing or not carried by the codec.
        RankFailed: A rank raised (the message holds its rank and traceback; ``error``
            its exception chain as data).
        RuntimeError: a rank died without a result, or the run took longer than
            ``timeout_s``.
        FrameError: a rank sent bytes that are not a typed frame of what they should hold.
    """
    if world_size < 1:
        raise ValueError(f"spawn_group needs world_size >= 1, got {world_size}")
    if on_progress is not None and progress_type is None:
        raise ValueError("spawn_group: on_progress needs the progress messages' progress_type")
    target, signature = body_target(fn), rank_signature(fn)
    call = encode_frame(args, signature.args)
    ctx = rank_context(preload)
    store_dir = tempfile.mkdtemp(prefix="cpkv-spawn-")
    init_method = f"file://{store_dir}/store"
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    procs = [
        ctx.Process(
            target=child_main,
            args=(rank, world_size, init_method, backend, timeout_s, target, call, writer),
            name=f"cpkv-rank{rank}",
            daemon=True,
        )
        for rank, (_, writer) in enumerate(pipes)
    ]
    inbox = _Pipes([reader for reader, _ in pipes])
    done: dict[int, object] = {}
    try:
        for p, (_, writer) in zip(procs, pipes, strict=True):
            p.start()
            writer.close()  # NOTE: the child holds the only writer: its exit reads as EOF
        expect = _Expect(signature.result, progress_type, on_progress)
        done = _collect(inbox, procs, timeout_s, expect)
    finally:
        _teardown(procs, graceful=len(done) == world_size)
        inbox.close()
        shutil.rmtree(store_dir, ignore_errors=True)
    return [cast(T, done[rank]) for rank in range(world_size)]
