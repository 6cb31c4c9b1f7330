"""Spawn harness: run one function on every rank of a real multi-process torch.distributed group.

``spawn_group(world_size, fn, args)`` starts ``world_size`` processes with the ``spawn``
start method, rendezvous them through a ``file://`` store in a fresh temporary directory,
and calls ``fn(comm, *args)`` on each with a ``TorchDistCommunicator`` over the default
group. Results come back in rank order. Any failure, early exit or timeout tears every
process down and raises ``RuntimeError`` naming the rank, so a broken test never hangs.

A rank that stalls is named too: when a rank reports a ``CollectiveTimeout`` (its group's
collective timeout ran out), the ranks still running without a word are the ones it waited
for.

``fn`` must be a module-level function importable by a fresh interpreter (children import
it by name), and its arguments and result must be picklable. A child may call
``report_progress(message)`` to stream progress to the parent's ``on_progress``.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Protocol, TypeVar, cast

import torch

from cpkv_core.dist import comm as comm_mod

__all__ = ["ProgressEvent", "dumps", "loads", "progress_to", "report_progress", "spawn_group"]

T = TypeVar("T")

_POLL_S = 0.05
"""Seconds between checks for results, progress and dead children."""
_EXIT_GRACE_S = 2.0
"""Seconds to drain the queue after a child died, in case its report is still in flight."""
_JOIN_S = 5.0
"""Seconds a child may take to exit after its result before it is terminated."""


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """A progress message a spawned rank sent with ``report_progress``."""

    rank: int
    message: object


def dumps(obj: object) -> bytes:
    """Serialises a picklable object, tensors included, by value."""
    # NOTE: torch.save rather than pickle: plain pickle fails on float8 tensors (torch 2.13).
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def loads(data: bytes) -> object:
    """Inverse of ``dumps``; only ever fed bytes from our own ranks (it unpickles)."""
    return torch.load(io.BytesIO(data), weights_only=False)


class _Queue(Protocol):
    def put(self, obj: Any) -> None: ...

    def get(self, block: bool = ..., timeout: float | None = ...) -> Any: ...


_progress_queue: _Queue | None = None
_progress_rank = -1
_progress_sink: Callable[[object], None] | None = None
"""In-process receiver of ``report_progress`` (a rank started by torchrun), else None."""


def report_progress(message: object) -> None:
    """Sends a picklable ``message`` to the parent's ``on_progress`` (from a spawned rank),
    or to the sink ``progress_to`` set (in a torchrun rank).

    A no-op elsewhere, so worker functions may call it freely.
    """
    if _progress_queue is not None:
        _progress_queue.put(("progress", _progress_rank, dumps(message)))
    elif _progress_sink is not None:
        _progress_sink(message)


@contextmanager
def progress_to(sink: Callable[[object], None] | None) -> Iterator[None]:
    """Hands every ``report_progress`` message of this process to ``sink`` while inside."""
    global _progress_sink
    previous, _progress_sink = _progress_sink, sink
    try:
        yield
    finally:
        _progress_sink = previous


def _child_main(
    rank: int,
    world_size: int,
    init_method: str,
    backend: str,
    timeout_s: float,
    call: bytes,
    results: _Queue,
) -> None:
    """Entry point of one spawned rank: init, run ``fn``, report, tear down.

    NOTE: ``call`` (``fn`` and ``args``) and every payload travel as bytes (see ``dumps``):
    importing torch makes multiprocessing send tensors as shared-memory handles, which die
    with the process that sent them.
    """
    global _progress_queue, _progress_rank
    torch.set_num_threads(1)
    _progress_queue, _progress_rank = results, rank
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        fn, args = cast(tuple[Callable[..., object], tuple[object, ...]], loads(call))
        comm_mod.init_process_group(rank, world_size, init_method, backend, timeout_s)
        value = dumps(fn(comm_mod.TorchDistCommunicator(), *args))
        comm_mod.destroy_process_group()
    except BaseException:
        # NOTE: no destroy here: peers may be blocked in a collective with this rank, and
        # the parent kills every process as soon as it reads this report.
        results.put(("error", rank, traceback.format_exc()))
        return
    results.put(("result", rank, value))


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
    results: _Queue, procs: Sequence[BaseProcess], done: dict[int, object], rank: int
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
            kind, other, _ = results.get(timeout=_POLL_S)
        except queue_mod.Empty:
            continue
        if kind != "progress":
            failed.add(other)
    return [
        f"rank {r} stalled (still running, neither a result nor an error, when the others' "
        "collective timed out)"
        for r, p in enumerate(procs)
        if r not in done and r not in failed and p.exitcode is None
    ]


def _collect(
    results: _Queue,
    procs: Sequence[BaseProcess],
    timeout_s: float,
    on_progress: Callable[[object], None] | None,
) -> dict[int, object]:
    """Waits for one result per rank; raises RuntimeError on an error, a death or timeout."""
    deadline = time.monotonic() + timeout_s
    done: dict[int, object] = {}
    exited_at: float | None = None
    while len(done) < len(procs):
        now = time.monotonic()
        if now > deadline:
            missing = [r for r in range(len(procs)) if r not in done]
            raise RuntimeError(
                f"spawn_group timed out after {timeout_s:g} s; ranks without a result: {missing}"
            )
        exited = [
            (r, p.exitcode) for r, p in enumerate(procs) if r not in done and p.exitcode is not None
        ]
        if exited:
            # NOTE: a child's report is flushed before it exits; the grace lets it arrive.
            exited_at = now if exited_at is None else exited_at
            if now - exited_at > _EXIT_GRACE_S:
                r, code = exited[0]
                raise RuntimeError(f"rank {r} exited with code {code} before reporting a result")
        try:
            kind, rank, payload = results.get(timeout=_POLL_S)
        except queue_mod.Empty:
            continue
        if kind == "progress":
            if on_progress is not None:
                on_progress(ProgressEvent(rank, loads(payload)))
        elif kind == "error":
            if comm_mod.COLLECTIVE_TIMEOUT in payload:
                culprits = _stalled_peers(results, procs, done, rank)
            else:
                culprits = [
                    f"{d} before reporting a result" for d in _dead_peers(procs, done, rank)
                ]
            first = f"{'; '.join(culprits)}; then " if culprits else ""
            raise RuntimeError(f"{first}rank {rank} failed:\n{payload}")
        else:
            done[rank] = loads(payload)
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
) -> list[T]:
    """Runs ``fn(comm, *args)`` on every rank of a fresh ``world_size``-process group.

    Args:
        world_size: Processes to spawn (``>= 1``).
        fn: Module-level function ``fn(comm: Communicator, *args) -> T``; ``T`` picklable.
        args: Extra picklable arguments, the same for every rank.
        backend: torch.distributed backend (``"gloo"`` on CPU, ``"nccl"`` on CUDA).
        timeout_s: Limit for the whole run, start-up included (~3 s per process start);
            also the group's collective timeout.
        on_progress: Called in the parent with a ``ProgressEvent`` for every
            ``report_progress`` a child makes.

    Returns:
        Every rank's result, in rank order.

    Raises:
        ValueError: ``world_size < 1``.
        RuntimeError: A rank raised (the message holds its rank and traceback), a rank
            died without a result, or the run took longer than ``timeout_s``.
    """
    if world_size < 1:
        raise ValueError(f"spawn_group needs world_size >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store_dir = tempfile.mkdtemp(prefix="cpkv-spawn-")
    init_method = f"file://{store_dir}/store"
    call = dumps((fn, args))
    procs = [
        ctx.Process(
            target=_child_main,
            args=(rank, world_size, init_method, backend, timeout_s, call, results),
            name=f"cpkv-rank{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    done: dict[int, object] = {}
    try:
        for p in procs:
            p.start()
        done = _collect(results, procs, timeout_s, on_progress)
    finally:
        _teardown(procs, graceful=len(done) == world_size)
        results.close()
        shutil.rmtree(store_dir, ignore_errors=True)
    return [cast(T, done[rank]) for rank in range(world_size)]
