"""Per-tag byte counts of one rank's collectives (``CommStats``), kept by both communicators.

An all-gather of a local tensor of ``B`` bytes over ``W`` ranks records ``contributed = B``
and ``gathered = W * B`` (see ``comm``'s module docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass(slots=True)
class CollectiveStats:
    """Running totals of one tag's collectives on one rank.

    Attributes:
        calls: Collectives issued under the tag.
        bytes_contributed: Bytes this rank sent in (its local tensors).
        bytes_gathered: Bytes of the gathered results this rank received.
    """

    calls: int = 0
    bytes_contributed: int = 0
    bytes_gathered: int = 0


@dataclass(slots=True)
class CommStats:
    """Per-tag collective byte counts of one rank (see the module docstring for bytes)."""

    by_tag: dict[str, CollectiveStats] = field(default_factory=dict)

    def record(self, tag: str, contributed: int, gathered: int) -> None:
        """Adds one collective of ``contributed`` / ``gathered`` bytes under ``tag``."""
        stats = self.by_tag.setdefault(tag, CollectiveStats())
        stats.calls += 1
        stats.bytes_contributed += contributed
        stats.bytes_gathered += gathered

    def total_gathered(self) -> int:
        """Gathered bytes over all tags."""
        return sum(s.bytes_gathered for s in self.by_tag.values())

    def total_contributed(self) -> int:
        """Contributed bytes over all tags."""
        return sum(s.bytes_contributed for s in self.by_tag.values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        """Plain, picklable ``{tag: {calls, bytes_contributed, bytes_gathered}}``."""
        return {
            tag: {
                "calls": s.calls,
                "bytes_contributed": s.bytes_contributed,
                "bytes_gathered": s.bytes_gathered,
            }
            for tag, s in self.by_tag.items()
        }

    def reset(self) -> None:
        """Forgets every count."""
        self.by_tag.clear()


def record_all_gather(stats: CommStats, tag: str, tensor: Tensor, world_size: int) -> None:
    """Records one all-gather of ``tensor`` over ``world_size`` ranks under ``tag``."""
    contributed = tensor.numel() * tensor.element_size()
    stats.record(tag, contributed, world_size * contributed)
