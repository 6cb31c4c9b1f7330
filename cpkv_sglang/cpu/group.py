"""The one part of SGLang the CPU harness replaces: its process groups.

SGLang's CP code all-gathers through ``get_parallel().attn_cp_group.all_gather_into_tensor``
(a ``GroupCoordinator`` over NCCL on a GPU server). :class:`CommGroup` has that method over
a cpkv ``Communicator`` (a gloo process group of the rank processes), so every rank's bytes
really cross processes, and it counts each gather's rows and bytes. :class:`LastPipelineRank`
is the model's one-stage pipeline group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from cpkv_core.dist import Communicator

__all__ = ["CommGroup", "Gathered", "LastPipelineRank"]


@dataclass(frozen=True, slots=True)
class Gathered:
    """One all-gather as this rank saw it."""

    rows: int
    """Rows of the gathered output (``cp_size x`` the rows each rank sent)."""
    nbytes: int
    """Bytes of the gathered output."""


@dataclass(slots=True)
class CommGroup:
    """SGLang's attention-CP group on CPU ranks: ``all_gather_into_tensor`` over ``comm``."""

    comm: Communicator
    gathers: list[Gathered] = field(default_factory=list)
    corrupt_next: bool = False
    """Add 1 to every value the next gather delivers (a game-day fault for the shadow
    check; the same on every rank, as a corrupted collective would be)."""

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return self.comm.world_size

    @property
    def rank_in_group(self) -> int:
        """This rank."""
        return self.comm.rank

    def all_gather_into_tensor(self, output: Tensor, input: Tensor) -> None:
        """Fills ``output`` (``[world_size * rows, ...]``) with every rank's ``input``
        (``[rows, ...]``) in rank order, as ``GroupCoordinator.all_gather_into_tensor``."""
        if output.shape[0] != self.world_size * input.shape[0]:
            raise ValueError(
                f"all_gather_into_tensor needs output rows = {self.world_size} x input rows, "
                f"got {output.shape[0]} and {input.shape[0]}"
            )
        stacked = self.comm.all_gather(input.contiguous(), "sglang_attn_cp")
        output.copy_(stacked.reshape(output.shape))
        if self.corrupt_next:
            output.add_(1)
            self.corrupt_next = False
        self.gathers.append(Gathered(output.shape[0], output.numel() * output.element_size()))

    def take(self) -> list[Gathered]:
        """The gathers since the last call."""
        taken, self.gathers = self.gathers, []
        return taken


@dataclass(frozen=True, slots=True)
class LastPipelineRank:
    """A model's ``pp_group`` with one pipeline stage (or this rank's stage, for a test of
    a non-last stage)."""

    is_last_rank: bool = True
