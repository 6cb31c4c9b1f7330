"""Ranks started by torchrun: this process is one rank of a group that may span machines.

``torchrun`` (``python -m torch.distributed.run``) starts ``--nproc-per-node`` workers on each
of ``--nnodes`` machines, rendezvouses them, and hands each its place in the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RUN_ID``). ``torchrun_env`` reads that place; ``TorchrunGroup`` joins the default
group with ``env://`` rendezvous and runs the same rank body ``spawn_group`` runs, then
gathers every rank's result to rank 0 as typed frames (``frames.py``) through a tensor
collective: rank 0 decodes only the annotated result type, so a peer (which may be on
another machine) cannot run code in it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar, cast

import torch

from cpkv_core.dist import comm as comm_mod
from cpkv_core.dist.launch import ProgressEvent, progress_to
from cpkv_core.dist.rank_body import rank_signature
from cpkv_core.dist.value_collectives import broadcast_value, gather_value

__all__ = ["TORCHRUN_VARIABLES", "TorchrunEnv", "TorchrunGroup", "torchrun_env"]

T = TypeVar("T")

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""The variables every torchrun worker gets and ``env://`` rendezvous reads."""
RUN_ID_VARIABLE = "TORCHELASTIC_RUN_ID"
"""Set by torchrun's agent for its workers (and only there)."""


@dataclass(frozen=True, slots=True)
class TorchrunEnv:
    """This worker's place in a torchrun job, as its agent set it; ``0 <= rank < world_size``."""

    rank: int
    world_size: int
    local_rank: int
    """Rank among the workers of this machine: picks the CUDA device under NCCL."""
    master_addr: str
    master_port: int
    run_id: str | None
    """``TORCHELASTIC_RUN_ID`` (``--rdzv-id``), None when the variables were set by hand."""


def _int_variable(environ: Mapping[str, str], name: str, low: int) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"torchrun variable {name}={raw!r} is not an integer") from None
    if value < low:
        raise ValueError(f"torchrun variable {name}={value} must be >= {low}")
    return value


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """This process's torchrun place, or None when it was not started by torchrun.

    A process counts as a torchrun worker when ``TORCHELASTIC_RUN_ID`` is set or when
    ``RANK`` and ``WORLD_SIZE`` both are; then every variable ``env://`` needs must be set.

    Raises:
        ValueError: a variable is missing or malformed (the message names it).
    """
    env = os.environ if environ is None else environ
    if RUN_ID_VARIABLE not in env and not ("RANK" in env and "WORLD_SIZE" in env):
        return None
    missing = [name for name in TORCHRUN_VARIABLES if not env.get(name)]
    if missing:
        raise ValueError(
            f"torchrun environment is incomplete: {', '.join(missing)} not set; start the "
            "command with torchrun (python -m torch.distributed.run)"
        )
    world_size = _int_variable(env, "WORLD_SIZE", 1)
    rank = _int_variable(env, "RANK", 0)
    if rank >= world_size:
        raise ValueError(f"torchrun variable RANK={rank} must be < WORLD_SIZE={world_size}")
    return TorchrunEnv(
        rank=rank,
        world_size=world_size,
        local_rank=_int_variable(env, "LOCAL_RANK", 0),
        master_addr=env["MASTER_ADDR"],
        master_port=_int_variable(env, "MASTER_PORT", 1),
        run_id=env.get(RUN_ID_VARIABLE) or None,
    )


class TorchrunGroup:
    """The default process group of a torchrun job, joined with ``env://`` rendezvous.

    Invariant: between ``__enter__`` and ``__exit__`` the default group is initialised with
    ``env.world_size`` ranks and this process is rank ``env.rank``. Every rank must make the
    same calls in the same order (``run``, then ``share_exit_code``): they are collectives.
    """

    def __init__(self, env: TorchrunEnv, backend: str = "gloo", timeout_s: float = 600.0) -> None:
        """Args:
        env: This worker's place (``torchrun_env()``).
        backend: ``"gloo"`` on CPU, ``"nccl"`` on CUDA (device ``LOCAL_RANK``).
        timeout_s: Bounds the rendezvous and every collective of the group.
        """
        self.env = env
        self.backend = backend
        self.timeout_s = timeout_s

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """Ranks in the group, over every machine."""
        return self.env.world_size

    def __enter__(self) -> TorchrunGroup:
        torch.set_num_threads(1)
        if self.backend == "nccl":
            torch.cuda.set_device(self.env.local_rank)
        comm_mod.init_process_group(
            self.env.rank, self.env.world_size, "env://", self.backend, self.timeout_s
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # NOTE: after a failure peers may be blocked in a collective with this rank; they
        # see the closed connection (or the timeout) and torchrun stops the job.
        if exc_type is None:
            comm_mod.destroy_process_group()

    def run(
        self,
        fn: Callable[..., T],
        args: tuple[object, ...] = (),
        on_progress: Callable[[object], None] | None = None,
    ) -> list[T] | None:
        """Runs ``fn(comm, *args)`` on this rank, as ``spawn_group`` runs it on each child.

        Args:
            fn: The rank body ``spawn_group`` takes: ``fn(comm: Communicator, *args) -> T``.
            args: The same on every rank.
            on_progress: Called on rank 0 with a ``ProgressEvent`` for every
                ``report_progress`` rank 0 makes.

        Returns:
            On rank 0 every rank's result in rank order; None on the other ranks.

        Raises:
            FrameError: on rank 0, a rank sent bytes that are not a frame of ``fn``'s
                return annotation.
        """
        result_type = rank_signature(fn).result
        comm = comm_mod.TorchDistCommunicator()
        sink = None
        if on_progress is not None and self.rank == 0:

            def sink(message: object) -> None:
                on_progress(ProgressEvent(0, message))

        with progress_to(sink):
            value = fn(comm, *args)
        gathered = gather_value(comm, value, result_type)
        return None if gathered is None else cast(list[T], gathered)

    def share_exit_code(self, code: int | None) -> int:
        """Rank 0's ``code`` on every rank (others pass None), so that all exit alike."""
        comm = comm_mod.TorchDistCommunicator()
        shared = broadcast_value(comm, code, int | None, "exit code")
        assert isinstance(shared, int), f"rank {self.rank} got exit code {shared!r}"
        return shared
