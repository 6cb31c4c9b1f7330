"""Reason codes as the app shows them: the code of a gate reason, its short label and meaning.

Reasons are structured (``phases.Reason``: a code and typed values); the app reads the code
and keeps the text for ``--json`` and ``explain --batch N``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from phases import Reason

DISABLED = "DISABLED"
"""The code of a phase that is not in the enabled set; tables leave it out."""
NEEDS_INACTIVE = "NEEDS_INACTIVE"
"""The code of a phase whose need is off; tables show it only when it is the only code."""
CP_OFF = "CP_OFF"
"""The code of a batch that runs unsplit; tables show it once per batch, not per phase."""

SHORT_LABELS: dict[str, str] = {
    "NEEDS_INACTIVE": "NEEDS",
    "STARTUP_CONTRACT": "STARTUP",
    "SPEC_DECODE": "SPEC",
    "RETURN_LOGPROB": "LOGPROB",
    "CAPTURE_HIDDEN": "HIDDEN",
    "SHORT_REQUEST": "SHORT",
    "UNBALANCED": "UNBAL",
    "NOT_PAGE_ALIGNED": "UNALIGNED",
    "OWNER_MISMATCH": "OWNER",
    "NOT_OWNER_ALLOCATED": "DEALT",
}
"""Table labels of the long codes; a code not listed is shown as itself."""

MEANINGS: dict[str, str] = {
    "DISABLED": "the phase is not in the enabled set",
    "UNAVAILABLE": "enabled, but this build has no mechanics for the phase",
    "STARTUP_CONTRACT": "its start-up contract does not hold for this deployment",
    "CEILING": "above the kill-switch ceiling CPKV_MAX_PHASE",
    "NEEDS_INACTIVE": "a phase it needs is off (shown when it is the phase's only reason)",
    "SPEC_DECODE": "speculative decoding needs every hidden state",
    "RETURN_LOGPROB": "a request returns the logprobs of every token",
    "CAPTURE_HIDDEN": "a request captures every hidden state",
    "HAS_HISTORY": "a request already has KV in the cache (prefix hit or earlier chunk)",
    "SHORT_REQUEST": "a request spans fewer than 2*cp_size pages",
    "UNBALANCED": "page interleave would idle a rank or load one beyond the bound (max/mean)",
    "NOT_PAGE_ALIGNED": "the batch's split is not page-aligned (a short request)",
    "OWNER_MISMATCH": "a chunk resumes in a page another rank owns",
    "NOT_OWNER_ALLOCATED": "the batch's pages were dealt, not put on their compute owners",
    "KILLED": "its kill switch tripped at runtime",
    "CP_OFF": (
        "SGLang 0.5.23 would not split the batch (rule=sglang: a request below 2*cp_size "
        "current tokens under zigzag, the batch below cp_size under interleave) or it has "
        "fewer than --nsa-prefill-cp-min-tokens: every rank computes the whole batch (split "
        "none), and phases 1, 4, 5 are off for it"
    ),
}
"""What each code means, for the legend under a table; see docs/phases/README.md."""


def reason_code(reason: Reason) -> str:
    """The stable code of one gate reason (``HAS_HISTORY``)."""
    return str(reason.code)


def short_label(code: str) -> str:
    """The table label of ``code`` (``SHORT_REQUEST`` -> ``SHORT``)."""
    return SHORT_LABELS.get(code, code)


def count_codes(reasons: Iterable[Reason]) -> Counter[str]:
    """Reason codes counted, in first-seen order."""
    return Counter(reason_code(r) for r in reasons)
