"""The rank side of the spawn harness: a spawned rank's entry point and its progress reports.

A spawned rank (``child_main``) writes to its own pipe: a kind byte (``PROGRESS``, ``RESULT``
or ``ERROR``), then a typed frame. ``launch.spawn_group`` reads those pipes in the parent.
A rank that torchrun started has no pipe; ``progress_to`` hands its progress to a sink in
its own process instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from cpkv_core.dist import comm as comm_mod
from cpkv_core.dist.rank_body import import_body, rank_signature
from cpkv_core.dist.rank_errors import RankError, rank_error
from cpkv_core.dist.typed.frames import decode_frame, encode_frame

__all__ = [
    "ERROR",
    "PROGRESS",
    "RESULT",
    "ProgressEvent",
    "child_main",
    "progress_to",
    "report_progress",
]

PROGRESS, RESULT, ERROR = b"P", b"R", b"E"
"""The first byte of a message on a rank's pipe; a typed frame follows."""


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """A progress message a spawned rank sent with ``report_progress``."""

    rank: int
    message: object


_progress_pipe: Connection | None = None
_progress_sink: Callable[[object], None] | None = None
"""In-process receiver of ``report_progress`` (a rank started by torchrun), else None."""


def report_progress(message: object) -> None:
    """Sends ``message`` to the parent's ``on_progress`` (from a spawned rank), or to the
    sink ``progress_to`` set (in a torchrun rank).

    From a spawned rank it travels as a typed frame of its own class, which must be the
    parent's ``progress_type``. A no-op elsewhere, so worker functions may call it freely.
    """
    if _progress_pipe is not None:
        _progress_pipe.send_bytes(PROGRESS + encode_frame(message, type(message)))
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


def child_main(
    rank: int,
    world_size: int,
    init_method: str,
    backend: str,
    timeout_s: float,
    target: tuple[str, str],
    args: bytes,
    pipe: Connection,
) -> None:
    """Entry point of one spawned rank: init, run ``fn``, report, tear down.

    NOTE: every payload travels as a typed frame (``frames``): importing torch makes
    multiprocessing send tensors as shared-memory handles, which die with the process that
    sent them, and a pickle from a rank would be code the parent runs.
    """
    global _progress_pipe
    torch.set_num_threads(1)
    _progress_pipe = pipe
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        fn = import_body(*target)
        signature = rank_signature(fn)
        values = decode_frame(args, signature.args, "the call's arguments")
        comm_mod.init_process_group(rank, world_size, init_method, backend, timeout_s)
        result = encode_frame(fn(comm_mod.TorchDistCommunicator(), *values), signature.result)
        comm_mod.destroy_process_group()
    except BaseException as exc:
        # NOTE: no destroy here: peers may be blocked in a collective with this rank, and
        # the parent kills every process as soon as it reads this report.
        pipe.send_bytes(ERROR + encode_frame(rank_error(exc), RankError))
        return
    pipe.send_bytes(RESULT + result)
