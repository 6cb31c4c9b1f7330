"""One rank of a CP group, alone in this process: what a rank's collectives move, without
running its peers.

The real-rows bench times one rank's data movement per op. Its peers run the same op on
their own devices at the same time; here they are not run, and each all-gather hands the
rank every peer's part as a tensor of the right shape and dtype holding random bytes (an
all-gather takes equal shapes from every rank, so the rank's own part gives the shape). The
result is built as the in-process group builds it (``torch.stack`` of every rank's part
into one new tensor), so the bytes the rank receives are moved and counted as in a run.

A part of up to ``DISTINCT_PART_BYTES`` gets one random tensor per peer, made once per
shape and kept, so no peer's part is read from the cache another peer's part left. A larger
part is bigger than the last-level cache anyway, and every peer's part is the rank's own
(random bytes too): the rank then holds no memory for its peers' views of hundreds of MB.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cpkv_core.dist.comm import CommStats, GatherHandle, record_all_gather

__all__ = ["RankAlone", "random_bytes_"]

DISTINCT_PART_BYTES = 64 << 20
"""Largest part that each peer sends as its own tensor (more than a server CPU's
last-level cache)."""
_RANDOM_BLOCK = 1 << 20
"""Bytes of random data tiled over a tensor by ``random_bytes_``."""


def random_bytes_(tensor: Tensor, seed: int = 0) -> Tensor:
    """Fills ``tensor`` (contiguous) with random bytes: a random block of 1 MiB, tiled.

    Every page of the tensor is written, so later reads touch real memory, not the zero
    page a fresh allocation maps.
    """
    flat = tensor.view(-1).view(torch.uint8)
    if not flat.numel():
        return tensor
    gen = torch.Generator().manual_seed(seed)
    size = min(_RANDOM_BLOCK, flat.numel())
    block = torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8).to(flat.device)
    whole = flat.numel() // size * size
    flat[:whole].view(-1, size).copy_(block.expand(whole // size, size))
    flat[whole:].copy_(block[: flat.numel() - whole])
    return tensor


class RankAlone:
    """Rank ``rank`` of a ``world_size`` group whose peers are not run (module docstring).

    Only the all-gathers carry data; the object collectives are this rank's alone.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.stats = CommStats()
        self._parts: dict[tuple[torch.Size, torch.dtype, torch.device], list[Tensor]] = {}

    def _peer_parts(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's part of an all-gather of ``tensor`` (module docstring)."""
        # NOTE: looked up before anything else: the lookup is all a warm call pays, so the
        # stand-in adds next to nothing to a small gather's time (the narrow tail's is ~50 us).
        key = (tensor.shape, tensor.dtype, tensor.device)
        peers = self._parts.get(key)
        if peers is None:
            peers = self._parts[key] = self._new_peers(tensor)
        if not peers:
            return [tensor] * self.world_size
        return [*peers[: self.rank], tensor, *peers[self.rank :]]

    def _new_peers(self, tensor: Tensor) -> list[Tensor]:
        """Random parts for the peers of ``tensor``'s shape; none past ``DISTINCT_PART_BYTES``,
        where the rank's own part stands in for every peer's."""
        if tensor.numel() * tensor.element_size() > DISTINCT_PART_BYTES:
            return []
        return [
            random_bytes_(torch.empty_like(tensor, memory_format=torch.contiguous_format), r)
            for r in range(self.world_size - 1)
        ]

    def forget_parts(self) -> None:
        """Frees the peers' parts made so far."""
        self._parts.clear()

    def all_gather(self, tensor: Tensor, tag: str) -> Tensor:
        """See ``Communicator.all_gather``."""
        record_all_gather(self.stats, tag, tensor, self.world_size)
        return torch.stack(self._peer_parts(tensor))

    def all_gather_async(self, tensor: Tensor, tag: str, out: Tensor | None = None) -> GatherHandle:
        """See ``Communicator.all_gather_async``; completes before it returns."""
        gathered = self.all_gather(tensor, tag)
        if out is None:
            return GatherHandle(None, gathered, tensor.dtype, tensor)
        out.view(torch.uint8).copy_(gathered.view(torch.uint8))
        return GatherHandle(None, out, tensor.dtype, tensor)

    def barrier(self) -> None:
        """See ``Communicator.barrier``: nothing to wait for."""

    def gather_objects(self, obj: object) -> list[object] | None:
        """See ``Communicator.gather_objects``: this rank's object in every slot."""
        return [obj] * self.world_size if self.rank == 0 else None

    def broadcast_object(self, obj: object) -> object:
        """See ``Communicator.broadcast_object``: this rank's object."""
        return obj

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        """See ``Communicator.all_gather_ints``: this rank's values in every slot."""
        return [tuple(values)] * self.world_size

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        """See ``Communicator.gather_bytes``: this rank's bytes in every slot."""
        return [data] * self.world_size if self.rank == 0 else None

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """See ``Communicator.broadcast_bytes``: this rank's bytes (it stands for rank 0)."""
        if data is None:
            raise RuntimeError("RankAlone.broadcast_bytes: the rank alone stands for rank 0")
        return data
