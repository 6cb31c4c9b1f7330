"""``cpkv explain --decision-log``: the batches a server's plugin decided, and their totals."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cpkv.run.decision_log import DecisionLogReport, LoggedBatch


def render_decision_log(console: Console, report: DecisionLogReport) -> None:
    """Every batch's decision and tail, then the totals."""
    table = Table(title=f"decisions of {escape(str(report.path))}")
    for name in ("batch", "tokens", "reqs", "split", "phase", "tail", "reasons"):
        table.add_column(name, justify="right" if name in ("batch", "tokens", "reqs") else "left")
    for logged in report.batches:
        decision = logged.decision
        table.add_row(
            str(decision.batch),
            str(decision.tokens),
            str(decision.requests),
            _split(logged),
            str(decision.phase),
            _tail(logged),
            escape(" ".join(decision.reasons)) or "-",
        )
    console.print(table)
    render_decision_totals(console, report)


def render_decision_totals(console: Console, report: DecisionLogReport) -> None:
    """The totals: batches and tokens per phase, reasons, tail gathers, shadow checks."""
    totals = report.totals()
    phases = ", ".join(
        f"phase {p}: {n} batches, {totals['tokens_by_phase'][p]} tokens"
        for p, n in totals["batches_by_phase"].items()
    )
    console.print(f"{totals['batches']} batches; {phases or '-'}")
    for name in ("reasons", "tail", "shadow"):
        counts = ", ".join(f"{code} {n}" for code, n in totals[name].items()) or "-"
        console.print(f"{name}: {escape(counts)}")


def _split(logged: LoggedBatch) -> str:
    decision = logged.decision
    if decision.split:
        return "yes"
    return "no (cpkv)" if decision.sglang_split else "no (sglang)"


def _tail(logged: LoggedBatch) -> str:
    tail = logged.tail
    if tail is None:
        return "-"
    text = tail.gather if tail.reason is None else f"stock:{tail.reason}"
    return text if tail.shadow is None else f"{text} (shadow {tail.shadow})"
