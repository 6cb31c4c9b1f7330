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


class KvWriteStrategy(StrEnum):
    """Where the current chunk's KV is stored after the all-gather."""

    REPLICATED = "replicated"
    """Every rank writes every current token into its full pool."""


class KvReadStrategy(StrEnum):
    """Where the indexer and attention read a request's keys from."""

    LOCAL_POOL = "local-pool"
    """The rank's own full (replicated) pool."""


class OutputStrategy(StrEnum):
    """How hidden states are collected at the tail."""

    FULL_GATHER = "full-gather"
    """All-gather every current token's hidden state (``num_tokens x hidden``)."""
    NARROW_LAST_TOKEN = "narrow-last-token"
    """Each rank contributes the last-token states it computed (``cp_size x bs x hidden``)."""


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """The strategies a batch runs with."""

    split: SplitStrategy
    kv_write: KvWriteStrategy
    kv_read: KvReadStrategy
    output: OutputStrategy

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
