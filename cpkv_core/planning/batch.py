"""Host-side batch metadata: what the scheduler knows of a prefill batch before tensor work."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request's part of a prefill batch.

    ``prefix_len`` tokens are already in the KV cache (an earlier chunk of the same ``rid``
    or, for a new ``rid``, a prefix shared from ``prefix_from``); ``extend_len`` tokens are
    computed in this batch at logical positions ``[prefix_len, prefix_len + extend_len)``.
    """

    rid: str
    prefix_len: int
    extend_len: int
    prefix_from: str | None = None
    return_logprob: bool = False
    capture_hidden: bool = False

    @property
    def seq_len(self) -> int:
        """Tokens of the request once this batch is done."""
        return self.prefix_len + self.extend_len


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """One prefill batch: its index in the trace, the speculative algorithm, its requests."""

    batch: int
    requests: tuple[RequestSpec, ...]
    spec: str | None = None

    @property
    def extend_lens(self) -> tuple[int, ...]:
        """Current tokens per request, in batch order."""
        return tuple(r.extend_len for r in self.requests)

    @property
    def num_tokens(self) -> int:
        """Current tokens in the whole batch."""
        return sum(r.extend_len for r in self.requests)

    @property
    def has_history(self) -> bool:
        """True when any request already has tokens in the KV cache."""
        return any(r.prefix_len > 0 for r in self.requests)
