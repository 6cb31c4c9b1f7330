"""A decision log the SGLang plugin wrote (``CPKV_DECISION_LOG``), read back for ``cpkv
explain --decision-log``: :func:`read_decision_log`.

The log holds one JSON object a line, a ``decision`` (the gate's, per batch) or a ``tail``
(how the batch's tail gathered), as :mod:`phases.decision_log` defines them. The report
keeps each batch's decision with its tail and counts them: batches and tokens per phase,
reasons by code, tail gathers and their fallbacks, shadow checks.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phases.decision_log import DecisionRecord, TailRecord, parse_log_line


@dataclass(frozen=True, slots=True)
class LoggedBatch:
    """One batch of the log: the gate's decision and, once the tail ran, its gather."""

    decision: DecisionRecord
    tail: TailRecord | None

    def to_json(self) -> dict[str, Any]:
        """The decision's fields, then ``tail`` (None before the tail was logged)."""
        tail = None if self.tail is None else self.tail.to_json()
        return self.decision.to_json() | {"tail": tail}


@dataclass(frozen=True, slots=True)
class DecisionLogReport:
    """The batches of a decision log, in order, and what they add up to."""

    path: Path
    batches: tuple[LoggedBatch, ...]

    def totals(self) -> dict[str, Any]:
        """Batches and tokens per phase, reason codes, tail gathers, shadow checks."""
        by_phase: Counter[int] = Counter()
        tokens: Counter[int] = Counter()
        reasons: Counter[str] = Counter()
        tails: Counter[str] = Counter()
        shadow: Counter[str] = Counter()
        for logged in self.batches:
            decision = logged.decision
            by_phase[decision.phase] += 1
            tokens[decision.phase] += decision.tokens
            reasons.update(reason.split(" ", 1)[0] for reason in decision.reasons)
            if logged.tail is not None:
                tails[logged.tail.gather] += 1
                if logged.tail.reason is not None:
                    tails[f"stock:{logged.tail.reason}"] += 1
                if logged.tail.shadow is not None:
                    shadow[logged.tail.shadow] += 1
        return {
            "batches": len(self.batches),
            "batches_by_phase": {str(p): n for p, n in sorted(by_phase.items())},
            "tokens_by_phase": {str(p): n for p, n in sorted(tokens.items())},
            "reasons": dict(sorted(reasons.items())),
            "tail": dict(sorted(tails.items())),
            "shadow": dict(sorted(shadow.items())),
        }

    def to_json(self, summary_only: bool = False) -> dict[str, Any]:
        """``{"decision_log", "totals", "batches"}`` (no batches with ``summary_only``)."""
        document: dict[str, Any] = {"decision_log": str(self.path), "totals": self.totals()}
        if not summary_only:
            document["batches"] = [logged.to_json() for logged in self.batches]
        return document


def read_decision_log(path: Path) -> DecisionLogReport:
    """The batches of the decision log at ``path``.

    Raises:
        ValueError: the file cannot be read, a line is not a record (named by its number),
            a batch is decided twice, or a tail names a batch never decided.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the decision log {path}: {exc}") from exc
    decisions: dict[int, DecisionRecord] = {}
    tails: dict[int, TailRecord] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_log_line(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a decision-log record: {exc}") from None
        _add(record, decisions, tails, f"{path}:{number}")
    batches = tuple(LoggedBatch(d, tails.get(b)) for b, d in decisions.items())
    return DecisionLogReport(path, batches)


def _add(
    record: DecisionRecord | TailRecord,
    decisions: dict[int, DecisionRecord],
    tails: dict[int, TailRecord],
    where: str,
) -> None:
    if isinstance(record, DecisionRecord):
        if record.batch in decisions:
            raise ValueError(f"{where}: batch {record.batch} is decided twice")
        decisions[record.batch] = record
        return
    if record.batch not in decisions:
        raise ValueError(f"{where}: a tail of batch {record.batch}, which was never decided")
    tails[record.batch] = record
