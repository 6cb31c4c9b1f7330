"""The gate's decisions as data: one :class:`DecisionRecord` per batch, one :class:`TailRecord`
per tail gather, and :func:`parse_log_line` to read either back.

The SGLang plugin writes them as JSON Lines (``CPKV_DECISION_LOG``); ``cpkv explain
--decision-log`` reads them. A line is a decision (``"decision": {...}``) or a tail gather
(``"tail": {...}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DecisionRecord", "TailRecord", "parse_log_line"]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """The gate's decision for one forward batch of a server."""

    batch: int
    """Index of the batch among those the process decided (the same on every CP rank)."""
    tokens: int
    requests: int
    sglang_split: bool
    """SGLang's own rule (``can_apply``) splits the batch."""
    split: bool
    """The batch runs split: SGLang's rule, and then cpkv's CP-off minimum, allow it."""
    phase: int
    """The highest phase active for the batch (0: none)."""
    reasons: tuple[str, ...]
    """``CP_OFF ...`` when unsplit, then ``N:REASON ...`` for every phase the plugin runs
    that is enabled but inactive."""

    def to_json(self) -> dict[str, Any]:
        """The record as plain data (the ``decision`` of a log line)."""
        return {
            "batch": self.batch,
            "tokens": self.tokens,
            "requests": self.requests,
            "sglang_split": self.sglang_split,
            "split": self.split,
            "phase": self.phase,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class TailRecord:
    """How one batch's tail gathered its hidden states."""

    batch: int
    gather: str
    """``narrow`` (phase 1: ``cp x bs`` rows) or ``stock`` (every token's row)."""
    reason: str | None
    """Why a batch the gate gave phase 1 took the stock gather (``RETURN_LOGPROB``,
    ``SHADOW_MISMATCH``, ...); None for a narrow one."""
    shadow: str | None
    """``agreed`` or ``mismatched`` when the shadow compared the batch, else None."""

    def to_json(self) -> dict[str, Any]:
        """The record as plain data (the ``tail`` of a log line)."""
        return {
            "batch": self.batch,
            "gather": self.gather,
            "reason": self.reason,
            "shadow": self.shadow,
        }


_DECISION_FIELDS = {
    "batch": int,
    "tokens": int,
    "requests": int,
    "sglang_split": bool,
    "split": bool,
    "phase": int,
    "reasons": list,
}
_TAIL_FIELDS = {"batch": int, "gather": str, "reason": (str, type(None))}


def parse_log_line(document: Any) -> DecisionRecord | TailRecord:
    """The record one decoded log line holds.

    Raises:
        ValueError: not an object with one ``decision`` or ``tail`` of the fields above,
            each of its type (a bool is not an int).
    """
    if not isinstance(document, dict) or len(document) != 1:
        raise ValueError('a line is an object with one key, "decision" or "tail"')
    ((kind, body),) = document.items()
    if kind == "decision":
        _check(body, _DECISION_FIELDS)
        if not all(isinstance(r, str) for r in body["reasons"]):
            raise ValueError("decision.reasons must be a list of strings")
        return DecisionRecord(**{**body, "reasons": tuple(body["reasons"])})
    if kind == "tail":
        _check(body, {**_TAIL_FIELDS, "shadow": (str, type(None))})
        if body["gather"] not in ("narrow", "stock"):
            raise ValueError(f"tail.gather must be narrow or stock, got {body['gather']!r}")
        return TailRecord(**body)
    raise ValueError(f'a line is a "decision" or a "tail", got {kind!r}')


def _check(body: Any, fields: dict[str, Any]) -> None:
    if not isinstance(body, dict) or set(body) != set(fields):
        found = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise ValueError(f"needs exactly the fields {sorted(fields)}, got {found}")
    for name, kind in fields.items():
        value = body[name]
        bad_bool = isinstance(value, bool) and kind is int
        if bad_bool or not isinstance(value, kind):
            raise ValueError(f"{name} has the wrong type: {value!r}")
