"""KV pools a rank's peers can map, for peer-read materialization on one host.

Each rank's pool is carved from one flat arena (``kv_pool.carve_layers``); at start-up the
ranks hand each other their arenas once and carve the same layout from every peer's, so a
rank reads any owner's page with a plain ``index_select``. How an arena is handed over
depends on where the ranks run, found by exchanging ``(host, pid)`` at start-up:

- **reference**: ranks in one process (``LocalGroup`` threads, and the ``meta`` dry run):
  the arena tensors themselves;
- **shared file**: CPU processes: each arena is a file in ``/dev/shm`` that every rank maps
  (``torch.from_file(shared=True)``); only the path crosses the group, and the owner
  unlinks the file once every rank has mapped it (nothing is left behind);
- **CUDA IPC**: GPU processes: each arena's CUDA IPC handle
  (``torch.multiprocessing.reductions``), opened by every peer.

The start-up contract refuses peer-read when the ranks span hosts: shared memory does not
cross a host. The layout and ownership of the pools do not change.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cpkv_core.config import DeploymentConfig, IndexKDtype, MaterializeMode, ModelConfig
from cpkv_core.dist.comm import Communicator
from cpkv_core.dist.value_collectives import broadcast_value, gather_value
from cpkv_core.planning import KvLayout
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, arena_bytes, carve_layers

__all__ = [
    "PeerReadRefused",
    "PoolSharing",
    "RankPlace",
    "SharedPools",
    "check_one_host",
    "open_shared_pools",
    "rank_pool",
    "sharing_for",
]

SHM_DIR = Path("/dev/shm")
"""Where CPU processes put their pool arenas (a tmpfs on Linux)."""


class PoolSharing(StrEnum):
    """How the ranks of one host map each other's pools."""

    REFERENCE = "reference"
    """One process: the arena tensors themselves."""
    SHARED_FILE = "shared-file"
    """CPU processes: a ``/dev/shm`` file per arena, mapped by every rank."""
    CUDA_IPC = "cuda-ipc"
    """GPU processes: a CUDA IPC handle per arena."""


class PeerReadRefused(ValueError):
    """The start-up contract of peer-read failed: the ranks cannot map each other's pools."""


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank runs: its host name and process id."""

    host: str
    pid: int


def check_one_host(places: Sequence[RankPlace]) -> None:
    """Peer-read's start-up contract: every rank on one host.

    Raises:
        PeerReadRefused: the ranks span hosts; names each host's ranks and the fix.
    """
    hosts: dict[str, list[int]] = {}
    for rank, place in enumerate(places):
        hosts.setdefault(place.host, []).append(rank)
    if len(hosts) > 1:
        spans = "; ".join(f"{host}: ranks {ranks}" for host, ranks in hosts.items())
        raise PeerReadRefused(
            f"--materialize peer-read needs every CP rank on one host (peers map each "
            f"other's pools in shared memory), got {len(hosts)} hosts ({spans}); use "
            "--materialize gather"
        )


def sharing_for(places: Sequence[RankPlace], device: torch.device) -> PoolSharing:
    """The way ranks at ``places`` map each other's pools on ``device`` (one host)."""
    check_one_host(places)
    if len({place.pid for place in places}) == 1:
        return PoolSharing.REFERENCE
    if device.type == "cuda":
        return PoolSharing.CUDA_IPC
    if device.type == "cpu":
        return PoolSharing.SHARED_FILE
    raise PeerReadRefused(
        f"--materialize peer-read cannot share {device.type} pools between processes; "
        "use --device cpu or cuda, or --materialize gather"
    )


def _all_gather_objects(comm: Communicator, obj: object) -> list[object]:
    """Every rank's ``obj`` on every rank, pickled: for handles between the ranks of one
    host only (``check_one_host`` ran first)."""
    gathered = comm.broadcast_object(comm.gather_objects(obj))
    assert isinstance(gathered, list), f"rank {comm.rank} got {type(gathered)} for a gather"
    return gathered


@dataclass(frozen=True, slots=True)
class SharedPools:
    """This rank's pool and every rank's pool layers as this rank maps them.

    Invariant: ``peers[r][layer]`` reads the same memory that rank ``r``'s
    ``pool.layers[layer]`` writes (``peers[rank]`` is this rank's own).
    """

    pool: PagedKVPool
    peers: tuple[tuple[KVRows, ...], ...]
    sharing: PoolSharing
    comm: Communicator
    device: torch.device

    def batch_start(self) -> None:
        """Orders history: every rank's writes of earlier batches land before any rank
        reads them, and every read of earlier batches ends before any rank writes again.
        On CUDA the rank's stream drains first (its kernels, not just their launches)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.comm.barrier()


def _new_arena(sharing: PoolSharing, nbytes: int, device: torch.device) -> tuple[Tensor, Path]:
    """A zeroed arena, and its ``/dev/shm`` path for a shared file (else an empty path)."""
    if sharing is not PoolSharing.SHARED_FILE:
        return torch.zeros(nbytes, dtype=torch.uint8, device=device), Path()
    if not SHM_DIR.is_dir():
        raise PeerReadRefused(
            f"--materialize peer-read on CPU processes needs {SHM_DIR} (shared memory); it "
            "is missing on this host; use --materialize gather"
        )
    path = SHM_DIR / f"cpkv-pool-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)  # NOTE: a new file reads as zeros
    finally:
        os.close(fd)
    return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8), path


def _handles(sharing: PoolSharing, arena: Tensor, path: Path, world_size: int) -> list[object]:
    """What crosses the group so peers can map ``arena``, one per rank: the tensor, a path,
    or CUDA IPC args.

    CUDA IPC args are made once per peer: each ``reduce_tensor`` adds one to the owner's IPC
    ref counter and each peer's mapping takes one off when it is freed, so the owner can
    free its arena once every peer unmapped it (one set of args opened by several peers
    would leave the counter below zero and the arena in torch's limbo until exit)."""
    if sharing is PoolSharing.REFERENCE:
        return [arena] * world_size
    if sharing is PoolSharing.SHARED_FILE:
        return [str(path)] * world_size
    from torch.multiprocessing.reductions import reduce_tensor

    return [reduce_tensor(arena)[1] for _ in range(world_size)]  # type: ignore[no-untyped-call]


def _for_me(per_rank: object, rank: int) -> object:
    """The handle an owner made for ``rank``."""
    assert isinstance(per_rank, list), f"handles come one per rank, got {type(per_rank)}"
    return per_rank[rank]


def _open(sharing: PoolSharing, handle: object, nbytes: int) -> Tensor:
    """A peer's arena from its ``_handle``."""
    if sharing is PoolSharing.REFERENCE:
        assert isinstance(handle, Tensor), f"a reference handle is a tensor, got {type(handle)}"
        return handle
    if sharing is PoolSharing.SHARED_FILE:
        assert isinstance(handle, str), f"a shared-file handle is a path, got {type(handle)}"
        return torch.from_file(handle, shared=True, size=nbytes, dtype=torch.uint8)
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    assert isinstance(handle, tuple), f"a CUDA IPC handle is a tuple, got {type(handle)}"
    args: tuple[Any, ...] = handle
    opened: Tensor = rebuild_cuda_tensor(*args)  # type: ignore[no-untyped-call]
    return opened


def open_shared_pools(
    comm: Communicator,
    cfg: ModelConfig,
    num_pages: int,
    page_size: int,
    dtype: IndexKDtype,
    device: torch.device,
) -> SharedPools:
    """Allocates this rank's pool where its peers can map it and maps theirs; a start-up
    collective that every rank of ``comm`` calls together.

    Raises:
        PeerReadRefused: the ranks span hosts, or cannot share pools on ``device``.
    """
    # NOTE: places travel as typed frames: a peer on another host is refused before any
    # pickled handle crosses.
    place = RankPlace(socket.gethostname(), os.getpid())
    gathered = gather_value(comm, place, RankPlace, "place")
    places: list[RankPlace] = broadcast_value(comm, gathered, list[RankPlace], "places")
    sharing = sharing_for(places, device)
    nbytes = arena_bytes(cfg, num_pages, page_size, dtype)
    arena, path = _new_arena(sharing, nbytes, device)
    try:
        # NOTE: no args for this rank's own arena: it is read in place.
        mine = _handles(sharing, arena, path, comm.world_size - 1)
        mine.insert(comm.rank, None)
        handles = _all_gather_objects(comm, mine)
        arenas = [
            arena if owner == comm.rank else _open(sharing, _for_me(per_rank, comm.rank), nbytes)
            for owner, per_rank in enumerate(handles)
        ]
        comm.barrier()  # NOTE: every peer has mapped this arena before its file goes
    finally:
        if sharing is PoolSharing.SHARED_FILE:
            path.unlink(missing_ok=True)
    pool = PagedKVPool(cfg, num_pages, page_size, dtype, device, arena=arena)
    peers = tuple(carve_layers(cfg, num_pages, page_size, dtype, a) for a in arenas)
    return SharedPools(pool, peers, sharing, comm, device)


def rank_pool(
    comm: Communicator,
    cfg: ModelConfig,
    deploy: DeploymentConfig,
    num_pages: int,
    kv_layout: KvLayout,
    device: torch.device,
) -> tuple[PagedKVPool, SharedPools | None]:
    """This rank's pool for ``num_pages`` logical pages (its own pages only when sharded),
    and the peers' pools it maps under peer-read on a sharded layout (else None)."""
    pool_pages = num_pages if kv_layout is KvLayout.REPLICATED else -(-num_pages // deploy.cp_size)
    if deploy.materialize is not MaterializeMode.PEER_READ:
        return PagedKVPool(cfg, pool_pages, deploy.page_size, deploy.index_k_dtype, device), None
    # NOTE: every level checks the one-host contract, so a replicated level 0 refuses a
    # deployment that peer-read could not serve later.
    shared = open_shared_pools(
        comm, cfg, pool_pages, deploy.page_size, deploy.index_k_dtype, device
    )
    return shared.pool, shared if kv_layout is KvLayout.SHARDED else None
