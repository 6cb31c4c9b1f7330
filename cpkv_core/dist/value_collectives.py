"""Typed values through byte collectives: a rank's value crosses as a frame, never a pickle.

``gather_value`` collects every rank's value on rank 0 (results, reports), and
``broadcast_value`` hands rank 0's value to every rank (a scheduled batch); both encode with
``typed.frames`` and move the bytes with the communicator's tensor collectives.
"""

from __future__ import annotations

from typing import Any

from cpkv_core.dist.comm import Communicator
from cpkv_core.dist.typed.frames import decode_frame, encode_frame

__all__ = ["broadcast_value", "gather_value"]


def gather_value(comm: Communicator, value: object, hint: Any, what: str = "result") -> Any:
    """Every rank's ``value`` (annotation ``hint``) on rank 0, in rank order; None elsewhere.

    Each travels as a frame through ``comm.gather_bytes`` (a tensor collective).

    Raises:
        FrameError: on rank 0, a rank sent bytes that are not a frame of ``hint`` (the
            message names the rank and ``what``).
    """
    gathered = comm.gather_bytes(encode_frame(value, hint))
    if gathered is None:
        return None
    return [
        decode_frame(frame, hint, f"rank {rank}'s {what}") for rank, frame in enumerate(gathered)
    ]


def broadcast_value(comm: Communicator, value: object, hint: Any, what: str = "value") -> Any:
    """Rank 0's ``value`` (annotation ``hint``) on every rank; the others pass anything.

    Raises:
        FrameError: rank 0 sent bytes that are not a frame of ``hint``.
    """
    frame = comm.broadcast_bytes(encode_frame(value, hint) if comm.rank == 0 else None)
    return value if comm.rank == 0 else decode_frame(frame, hint, f"rank 0's {what}")
