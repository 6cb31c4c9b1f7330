"""What the scheduler emits: one frozen ``ScheduledBatch`` per batch, with its requests
(``ScheduledRequest``); every consumer (the gate, the CP ranks, the reference, the PD
sender) reads these and none allocates."""

from __future__ import annotations

from dataclasses import dataclass

from cpkv_core.planning.allocator import PageTable
from cpkv_core.planning.balance import RankLoad

__all__ = ["NO_OWNER", "ScheduledBatch", "ScheduledRequest"]

NO_OWNER = -1
"""``resume_page_owner`` of a chunk that starts on a page boundary."""


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request of a scheduled batch: its chunk and where its tokens live."""

    rid: str
    prefix_len: int
    """Tokens already in the KV cache (an earlier chunk or a shared prefix)."""
    extend_len: int
    """Tokens computed in this batch, at positions ``[prefix_len, seq_len)``."""
    page_table: PageTable
    """Logical pages of positions ``[0, seq_len)``, read-only."""
    rid_key: int
    """Token-id key (``tokens.rid_key``): the chunk's ids are ``token_ids(rid_key, pos)``."""
    resume_page_owner: int = NO_OWNER
    """Owner of the partly filled page this chunk resumes in; ``NO_OWNER`` when the chunk
    starts on a page boundary."""
    return_logprob: bool = False
    capture_hidden: bool = False

    @property
    def seq_len(self) -> int:
        """Tokens of the request once this batch is done."""
        return self.prefix_len + self.extend_len


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One batch as the scheduler committed it: the input every consumer shares.

    Invariant: ``requests[i].page_table`` holds ``ceil(seq_len / page_size)`` pages, and
    ``on_compute_owners`` is True only if every page a request writes is owned by the rank
    that computes it under the page-aligned split.
    """

    batch: int
    spec: str | None
    """Speculative algorithm (e.g. ``EAGLE``) or None."""
    requests: tuple[ScheduledRequest, ...]
    page_size: int
    cp_size: int
    """Owners of the logical page space (CP ranks)."""
    new_pages: PageTable
    """Pages allocated by this batch, in request and position order."""
    on_compute_owners: bool
    """Every page this batch writes is owned by its page-aligned compute owner."""
    extend_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    current_pages: tuple[int, ...]
    """Pages each request's current tokens touch (a partial first or last page counts)."""
    owner_load: RankLoad
    """Each rank's current tokens and causal work if every current page is computed by its
    owner: the load of the page-interleaved split (``balance.owner_load``)."""

    @property
    def num_tokens(self) -> int:
        """Current tokens of the batch."""
        return sum(self.extend_lens)

    @property
    def has_history(self) -> bool:
        """True when any request already has tokens in the KV cache."""
        return any(self.prefix_lens)
