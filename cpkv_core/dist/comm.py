"""Communication layer: the one module that imports ``torch.distributed``.

Everything above talks to a ``Communicator``: a real process group
(``TorchDistCommunicator``, gloo on CPU, NCCL on CUDA, here) or an in-process group of
threads (``local_group.LocalGroup``, for fast property tests). Both count the bytes of
every collective under a caller-chosen tag in ``CommStats``.

Byte accounting, per rank: an all-gather of a local tensor of ``B`` bytes over a group of
``W`` ranks records ``contributed = B`` (what this rank sends in) and ``gathered = W * B``
(the size of the gathered result this rank holds). The byte collectives that carry results
and host metadata (``gather_bytes``, ``broadcast_bytes``: typed frames, ``frames.py``) and the
object collectives that hand peer-read handles over on one host are bookkeeping, not KV
traffic, and are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from cpkv_core.dist.communicator import Communicator, GatherHandle
from cpkv_core.dist.stats import CollectiveStats, CommStats, record_all_gather

__all__ = [
    "COLLECTIVE_TIMEOUT",
    "CollectiveStats",
    "CollectiveTimeout",
    "CommStats",
    "Communicator",
    "GatherHandle",
    "TorchDistCommunicator",
    "destroy_process_group",
    "init_process_group",
    "new_group_communicator",
    "record_all_gather",
]


T = TypeVar("T")

COLLECTIVE_TIMEOUT = "CollectiveTimeout"
"""The name a collective timeout goes by in a rank's error report (``launch`` looks for it
to name the ranks that stalled)."""


class CollectiveTimeout(RuntimeError):
    """A collective waited its whole timeout: a peer stalled (or is gone without a word)."""

    def __init__(self, rank: int, what: str, waited_s: float, timeout_s: float) -> None:
        super().__init__(
            f"rank {rank} waited {waited_s:.1f} s in {what}, over the collective timeout of "
            f"{timeout_s:g} s: a peer stalled"
        )
        self.rank, self.waited_s, self.timeout_s = rank, waited_s, timeout_s


def _is_float8(dtype: torch.dtype) -> bool:
    """True for the 1-byte float types (float8 e4m3/e5m2 and friends)."""
    return dtype.is_floating_point and dtype.itemsize == 1


# NOTE: gloo has no single-tensor all-gather in every torch release we support; NCCL has.
_SINGLE_TENSOR_BACKENDS = frozenset({"nccl"})
# NOTE: torch 2.13 renamed all_gather_into_tensor (now a deprecated alias) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


class TorchDistCommunicator:
    """A ``Communicator`` over a torch.distributed process group.

    Float8 tensors travel as their uint8 bytes (gloo has no float8 types) and come back
    as float8, bit for bit.
    """

    def __init__(
        self, group: dist.ProcessGroup | None = None, timeout_s: float | None = None
    ) -> None:
        """Wraps ``group`` (a subgroup from ``dist.new_group`` or None for the default).

        ``timeout_s`` is the group's collective timeout: a collective that fails after
        waiting that long raises ``CollectiveTimeout`` (None: errors pass as they are).

        Raises:
            RuntimeError: No process group is initialised.
        """
        if not dist.is_initialized():
            raise RuntimeError(
                "TorchDistCommunicator needs an initialised process group; "
                "call cpkv_core.dist.comm.init_process_group first"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self.stats = CommStats()
        self.timeout_s = timeout_s

    def _timed(self, what: str, call: Callable[[], T]) -> T:
        """Runs one collective; a failure after the whole timeout is a ``CollectiveTimeout``."""
        start = time.monotonic()
        try:
            return call()
        except Exception as exc:
            waited = time.monotonic() - start
            # NOTE: gloo and NCCL word timeouts differently; the time waited does not lie.
            if self.timeout_s is not None and waited >= 0.9 * self.timeout_s:
                raise CollectiveTimeout(self.rank, what, waited, self.timeout_s) from exc
            raise

    def all_gather(self, tensor: Tensor, tag: str) -> Tensor:
        """See ``Communicator.all_gather``."""
        record_all_gather(self.stats, tag, tensor, self.world_size)
        wire = tensor.contiguous()
        if _is_float8(tensor.dtype):
            wire = wire.view(torch.uint8)
        if self.backend in _SINGLE_TENSOR_BACKENDS:
            flat = wire.reshape(-1)
            out = flat.new_empty((self.world_size * flat.numel(),))
            self._timed(
                f"all_gather({tag!r})", lambda: _all_gather_single(out, flat, group=self.group)
            )
            gathered = out.view(self.world_size, *tensor.shape)
        else:
            parts = [torch.empty_like(wire) for _ in range(self.world_size)]
            self._timed(
                f"all_gather({tag!r})", lambda: dist.all_gather(parts, wire, group=self.group)
            )
            gathered = torch.stack(parts)
        return gathered.view(tensor.dtype) if gathered.dtype != tensor.dtype else gathered

    def all_gather_async(self, tensor: Tensor, tag: str, out: Tensor | None = None) -> GatherHandle:
        """See ``Communicator.all_gather_async``: ``async_op=True`` on the process group."""
        record_all_gather(self.stats, tag, tensor, self.world_size)
        wire = tensor.contiguous()
        if out is None:
            out = wire.new_empty((self.world_size, *wire.shape))
        if _is_float8(tensor.dtype):
            wire, out = wire.view(torch.uint8), out.view(torch.uint8)
        if self.backend in _SINGLE_TENSOR_BACKENDS:
            work = _all_gather_single(
                out.view(-1), wire.reshape(-1), group=self.group, async_op=True
            )
        else:
            work = dist.all_gather(list(out.unbind(0)), wire, group=self.group, async_op=True)
        return GatherHandle(work, out, tensor.dtype, wire)

    def barrier(self) -> None:
        """See ``Communicator.barrier``."""
        self._timed("barrier", lambda: dist.barrier(group=self.group))

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        """See ``Communicator.all_gather_ints``: one int64 all-gather, not counted."""
        local = torch.tensor(list(values), dtype=torch.int64, device=self._host_device())
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        self._timed("all_gather_ints", lambda: dist.all_gather(parts, local, group=self.group))
        return [tuple(int(v) for v in part.tolist()) for part in parts]

    def _host_device(self) -> torch.device:
        """Where this group's byte collectives stage their tensors (NCCL moves CUDA only)."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        """See ``Communicator.gather_bytes``: every rank's length first (an all-gather, so
        every rank pads to the longest), then one gather of the padded uint8 payloads."""
        device = self._host_device()
        length = torch.tensor([len(data)], dtype=torch.int64, device=device)
        lengths = [torch.empty_like(length) for _ in range(self.world_size)]
        self._timed(
            "gather_bytes(lengths)", lambda: dist.all_gather(lengths, length, group=self.group)
        )
        sizes = [int(n) for n in torch.cat(lengths).tolist()]
        padded = torch.zeros(max(*sizes, 1), dtype=torch.uint8)
        if data:
            padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        padded = padded.to(device)
        parts = [torch.empty_like(padded) for _ in sizes] if self.rank == 0 else None
        dst = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        self._timed(
            "gather_bytes", lambda: dist.gather(padded, parts, dst=dst, group=self.group)
        )
        if parts is None:
            return None
        return [
            part[:size].cpu().numpy().tobytes() for part, size in zip(parts, sizes, strict=True)
        ]

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """See ``Communicator.broadcast_bytes``: the length first, then the payload."""
        device = self._host_device()
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        mine = data if self.rank == 0 and data is not None else b""
        if self.rank == 0 and data is None:
            raise RuntimeError("broadcast_bytes: rank 0 must pass the bytes, got None")
        length = torch.tensor([len(mine)], dtype=torch.int64, device=device)
        self._timed(
            "broadcast_bytes(length)", lambda: dist.broadcast(length, src=src, group=self.group)
        )
        size = int(length.item())
        payload = torch.zeros(max(size, 1), dtype=torch.uint8)
        if mine:
            payload[:size] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        payload = payload.to(device)
        self._timed(
            "broadcast_bytes", lambda: dist.broadcast(payload, src=src, group=self.group)
        )
        return mine if self.rank == 0 else payload[:size].cpu().numpy().tobytes()

    def gather_objects(self, obj: object) -> list[object] | None:
        """See ``Communicator.gather_objects``."""
        dst = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        out: list[object] | None = [None] * self.world_size if self.rank == 0 else None
        self._timed(
            "gather_objects", lambda: dist.gather_object(obj, out, dst=dst, group=self.group)
        )
        return out

    def broadcast_object(self, obj: object) -> object:
        """See ``Communicator.broadcast_object``."""
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        box = [obj]
        self._timed(
            "broadcast_object",
            lambda: dist.broadcast_object_list(box, src=src, group=self.group),
        )
        return box[0]


def new_group_communicator(
    ranks: Sequence[int], timeout_s: float | None = None
) -> TorchDistCommunicator | None:
    """Builds a communicator over a subgroup of the default group's ``ranks``.

    A collective over the default group: every rank must call it with the same ``ranks``.
    ``timeout_s`` bounds each of the subgroup's collectives (None: the default group's).

    Returns:
        The subgroup's communicator on member ranks (group-local rank = position in sorted
        ``ranks``), None elsewhere.
    """
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    group = dist.new_group(sorted(ranks), timeout=timeout)
    if dist.get_rank() not in ranks:
        return None
    return TorchDistCommunicator(group, timeout_s)


def init_process_group(
    rank: int,
    world_size: int,
    init_method: str,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> None:
    """Initialises the default process group (``file://`` or ``tcp://`` ``init_method``).

    ``timeout_s`` bounds the rendezvous and every later collective of the group.

    Returns once every rank of the group has connected to every other: gloo's
    ``init_process_group`` can return on a rank whose side of the mesh is up while a peer
    is still finishing its own, and a rank that then ran a body without a collective and
    exited closed the socket under that peer ("Gloo connectFullMesh failed ... Connection
    closed by peer", within 2 to 18 groups of 3 and 2 ranks on 2 cores other processes
    kept busy; ``tests/test_rendezvous.py``).
    The barrier holds every rank until the slowest has finished (on NCCL on the device
    the caller set, as NCCL asks).
    """
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    if backend == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def destroy_process_group() -> None:
    """Destroys the default process group if one is initialised."""
    if dist.is_initialized():
        dist.destroy_process_group()
