"""The ``ExecutionPlan``: one strategy per decision point of a CP prefill batch.

The engine executes a plan and never asks why it was chosen; the phases (``phases/``)
decide which strategies a batch gets. Each enum lists the strategies whose mechanics
exist; a phase adds its member together with its implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cpkv_core.config import CpMode


class SplitStrategy(StrEnum):
    """How current tokens are assigned to CP ranks."""

    ZIGZAG = "zigzag"
    """Token-balanced zigzag: 2*cp_size blocks per request, rank r takes r and 2*cp_size-1-r."""
    ROUND_ROBIN = "round-robin"
    """Token g of the batch to rank g % cp_size."""
    PAGE_ALIGNED_ZIGZAG = "page-aligned-zigzag"
    """Zigzag cut at logical page boundaries: every current page has one compute owner."""
    PAGE_INTERLEAVED = "page-interleaved"
    """Round-robin by logical page: page ``p``'s current tokens to rank ``p % cp_size``, its
    storage owner, so every current page has one compute owner, its owner."""
    NONE = "none"
    """No split: every rank computes every token (replicated compute, as if CP were off)."""


class KvWriteStrategy(StrEnum):
    """Where the current chunk's KV is stored after the all-gather."""

    REPLICATED = "replicated"
    """Every rank writes every current token into its full pool."""
    OWNER_FILTERED = "owner-filtered"
    """After the all-gather, each rank writes only the tokens of pages it owns."""
    COMPUTE_OWNER_DIRECT = "compute-owner-direct"
    """Each rank writes the KV it computed into its own pool; pages are allocated to their
    compute owner, so no all-gather is needed for the write."""


class KvReadStrategy(StrEnum):
    """Where the indexer and attention read a request's keys from."""

    LOCAL_POOL = "local-pool"
    """The rank's own full (replicated) pool."""
    MATERIALIZED_SLOT = "materialized-slot"
    """A per-call view gathered from the page owners, one slot per page-table entry."""
    MATERIALIZED_UNIQUE = "materialized-unique"
    """A per-call view gathered from the page owners, one slot per distinct page."""
    CURRENT_REUSE = "current-reuse"
    """The already all-gathered current chunk; only for batches without history."""


class KvLayout(StrEnum):
    """How persistent KV is laid out across CP ranks; fixed for an engine's lifetime."""

    REPLICATED = "replicated"
    """Every rank stores every logical page."""
    SHARDED = "sharded"
    """Each rank stores the pages it owns (``page % cp_size``)."""


class OutputStrategy(StrEnum):
    """How hidden states are collected at the tail."""

    FULL_GATHER = "full-gather"
    """All-gather every current token's hidden state (``num_tokens x hidden``)."""
    NARROW_LAST_TOKEN = "narrow-last-token"
    """Each rank contributes the last-token states it computed (``cp_size x bs x hidden``)."""
    LOCAL_LAST_TOKEN = "local-last-token"
    """Each rank picks every last-token state from its own rows and gathers nothing; only
    under the ``none`` split, where every rank computed every token."""


class DecisionPoint(StrEnum):
    """A decision point of the ``ExecutionPlan`` (its field name): where a batch's failure
    is attributed, to the phase whose strategy the plan runs there."""

    SPLIT = "split"
    KV_WRITE = "kv_write"
    KV_READ = "kv_read"
    OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """The strategies a batch runs with.

    Invariant: the output is ``local-last-token`` exactly when the split is ``none`` (a
    rank that computed every token gathers nothing at the tail, and a rank that did not
    cannot skip the gather).
    """

    split: SplitStrategy
    kv_write: KvWriteStrategy
    kv_read: KvReadStrategy
    output: OutputStrategy

    def __post_init__(self) -> None:
        unsplit = self.split is SplitStrategy.NONE
        if unsplit != (self.output is OutputStrategy.LOCAL_LAST_TOKEN):
            raise ValueError(
                f"output {self.output} does not fit split {self.split}: local-last-token "
                "requires the none split, and the none split requires local-last-token"
            )

    def strategy(self, point: DecisionPoint) -> StrEnum:
        """The strategy the plan runs at ``point``."""
        strategy: StrEnum = getattr(self, point.value)
        return strategy

    @property
    def kv_layout(self) -> KvLayout:
        """The persistent layout the write strategy stores into."""
        if self.kv_write is KvWriteStrategy.REPLICATED:
            return KvLayout.REPLICATED
        return KvLayout.SHARDED

    @classmethod
    def baseline(cls, cp_mode: CpMode) -> ExecutionPlan:
        """Phase 0: the configured split, replicated KV, local reads, full gather."""
        split = (
            SplitStrategy.ZIGZAG if cp_mode is CpMode.IN_SEQ_SPLIT else SplitStrategy.ROUND_ROBIN
        )
        return cls(
            split=split,
            kv_write=KvWriteStrategy.REPLICATED,
            kv_read=KvReadStrategy.LOCAL_POOL,
            output=OutputStrategy.FULL_GATHER,
        )

    @classmethod
    def unsplit(cls) -> ExecutionPlan:
        """A batch the gate runs with CP off: no split, replicated KV, local reads, no
        tail gather. Phases 2 and 3 may still change the write and the read."""
        return cls(
            split=SplitStrategy.NONE,
            kv_write=KvWriteStrategy.REPLICATED,
            kv_read=KvReadStrategy.LOCAL_POOL,
            output=OutputStrategy.LOCAL_LAST_TOKEN,
        )

    @property
    def computes_every_token(self) -> bool:
        """Every rank computes every token of the batch (the ``none`` split)."""
        return self.split is SplitStrategy.NONE
