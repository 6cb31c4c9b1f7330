"""Stable reason codes for why a phase is not active, and the reasons that carry them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ReasonCode(StrEnum):
    """Why a phase is inactive. Codes are stable: scripts match on them."""

    DISABLED = "DISABLED"
    """The phase is not in the enabled set."""
    NEEDS_INACTIVE = "NEEDS_INACTIVE"
    """A phase it needs is not active for this batch."""
    STARTUP_CONTRACT = "STARTUP_CONTRACT"
    """Its start-up contract does not hold for this deployment."""
    CEILING = "CEILING"
    """Above the kill-switch ceiling (``CPKV_MAX_PHASE``)."""
    SPEC_DECODE = "SPEC_DECODE"
    """Phase 1: speculative decoding needs every hidden state."""
    RETURN_LOGPROB = "RETURN_LOGPROB"
    """Phase 1: a request returns logprobs of every token."""
    CAPTURE_HIDDEN = "CAPTURE_HIDDEN"
    """Phase 1: a request captures every hidden state."""
    HAS_HISTORY = "HAS_HISTORY"
    """Phase 3: a request already has KV in the cache."""
    SHORT_REQUEST = "SHORT_REQUEST"
    """Phase 4 (in-seq-split): a request spans fewer than 2*cp_size pages."""
    UNBALANCED = "UNBALANCED"
    """Phase 4 (round-robin-split): the page interleave would leave a rank idle or load the
    busiest rank beyond the balance bound, so the batch keeps the token interleave."""
    NOT_PAGE_ALIGNED = "NOT_PAGE_ALIGNED"
    """Phase 5: the batch's split is not page-aligned."""
    UNAVAILABLE = "UNAVAILABLE"
    """Enabled, but this build has no mechanics for the phase yet."""
    OWNER_MISMATCH = "OWNER_MISMATCH"
    """Phase 5: a page the batch writes is owned by another rank than its compute owner."""
    KILLED = "KILLED"
    """Its kill switch tripped at runtime (a shadow mismatch or an operator's switch)."""
    NOT_OWNER_ALLOCATED = "NOT_OWNER_ALLOCATED"
    """Phase 5: the scheduler dealt the batch's pages (compute-owner allocation was off)."""
    CP_OFF = "CP_OFF"
    """The batch runs unsplit (every rank computes every token): SGLang 0.5.23 would not
    split it (``rule=sglang``: a request below ``2*cp_size`` current tokens under zigzag, the
    batch below ``cp_size`` under interleave), or it has fewer current tokens than
    ``--nsa-prefill-cp-min-tokens``. Phases that need a split are off for it."""


ReasonValue = int | str
"""A value that decided a reason: a count, a rid, a phase number, a setting."""


@dataclass(frozen=True, slots=True)
class Reason:
    """A reason code and the values that decided it; text is made only when rendered.

    ``str(Reason(SHORT_REQUEST, (("rid", "b"), ("pages", 2), ("need", 6))))`` is
    ``SHORT_REQUEST rid=b pages=2 need=6``.
    """

    code: ReasonCode
    values: tuple[tuple[str, ReasonValue], ...] = ()
    rule: str = ""
    """The rule broken, for start-up contracts (the contract field's documented rule)."""

    def __str__(self) -> str:
        parts = [str(self.code), *(f"{k}={v}" for k, v in self.values)]
        text = " ".join(parts)
        return f"{text}: {self.rule}" if self.rule else text

    def to_json(self) -> dict[str, object]:
        """``{"code", "values", "text"}``."""
        return {"code": str(self.code), "values": dict(self.values), "text": str(self)}
