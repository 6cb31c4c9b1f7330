"""Compact table cells: one line per batch at 100 columns, readable at 80.

Reasons become ``phase:CODE×count`` groups (``3:HAS_HISTORY×2 4:SHORT×3``) with a legend
printed once under the table; bytes become 5-character figures (``29.2K``); a plan becomes
``split/write/read/output`` in short words. Full text stays in ``--json`` and in
``cpkv explain TRACE --batch N``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from cpkv.run.reason_codes import (
    CP_OFF,
    DISABLED,
    MEANINGS,
    NEEDS_INACTIVE,
    count_codes,
    short_label,
)
from cpkv_core.planning.execution import ExecutionPlan
from phases.gate import BatchPlan

PLAN_WORDS: dict[str, str] = {
    "page-aligned-zigzag": "aligned",
    "page-interleaved": "page-rr",
    "owner-filtered": "filtered",
    "compute-owner-direct": "direct",
    "local-pool": "local",
    "materialized-slot": "slot",
    "materialized-unique": "unique",
    "current-reuse": "reuse",
    "full-gather": "full",
    "narrow-last-token": "narrow",
    "local-last-token": "own",
}
"""Short words for long strategy names; a name not listed is shown as itself."""

BYTES_NOTE = "bytes: K = KiB, M = MiB, G = GiB"
"""Printed under a table whose cells use :func:`short_bytes`."""


def human_bytes(num: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB"):
        if abs(num) < 1024:
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} GiB"


def short_bytes(num: float) -> str:
    """At most 5 characters: ``0``, ``980B``, ``29.2K``, ``459K``, ``2.14M`` (K = KiB)."""
    if num == 0:
        return "0"
    if abs(num) < 1024:
        return f"{num:.0f}B"
    for unit in ("K", "M", "G", "T"):
        num /= 1024
        if abs(num) < 1000 or unit == "T":
            break
    digits = 2 if abs(num) < 10 else 1 if abs(num) < 100 else 0
    return f"{num:.{digits}f}{unit}"


def fallback_codes(plan: BatchPlan) -> list[tuple[int, dict[str, int]]]:
    """Per inactive phase: its reason codes counted. A phase off only as DISABLED is left out,
    and so is NEEDS_INACTIVE next to another code (the other code says why). CP_OFF is said
    once for the batch (:func:`compact_reasons`), so a phase off only for it is left out."""
    rows = []
    for decision in plan.decisions:
        if decision.active:
            continue
        codes = count_codes(decision.reasons)
        if set(codes) == {DISABLED}:
            continue
        cp_off = codes.pop(CP_OFF, 0)
        if len(codes) > 1 or cp_off:
            codes.pop(NEEDS_INACTIVE, None)
        if codes:
            rows.append((int(decision.phase), dict(codes)))
    return rows


def compact_reasons(plan: BatchPlan) -> str:
    """``3:HAS_HISTORY×2 4:SHORT×3 5:UNALIGNED×3``, led by ``CP_OFF`` for a batch that runs
    unsplit; ``-`` when nothing fell back."""
    parts = [CP_OFF] if plan.cp_off is not None else []
    for phase, codes in fallback_codes(plan):
        labels = [short_label(c) + (f"×{n}" if n > 1 else "") for c, n in codes.items()]
        parts.append(f"{phase}:" + ",".join(labels))
    return " ".join(parts) or "-"


def plan_words(plan: ExecutionPlan) -> str:
    """``aligned/direct/reuse/narrow``: split, KV write, KV read, output in short words."""
    names = (plan.split, plan.kv_write, plan.kv_read, plan.output)
    return "/".join(PLAN_WORDS.get(str(n), str(n)) for n in names)


def figure_table(title: str, columns: Iterable[str]) -> Table:
    """A table of figures: one right-aligned column per name of ``columns``."""
    table = Table(title=title)
    for name in columns:
        table.add_column(name, justify="right")
    return table


def batch_table(title: str, numeric: Sequence[str], text: Sequence[str]) -> Table:
    """A borderless table: right-aligned ``numeric`` columns that never wrap, then ``text``
    columns; the last one wraps at spaces when the console is narrow. No header is cut."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0),
        collapse_padding=True,
    )
    for name in numeric:
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for i, name in enumerate(text):
        last = i == len(text) - 1
        table.add_column(name, no_wrap=not last, overflow="fold", min_width=len(name))
    return table


def print_legend(console: Console, plans: Iterable[BatchPlan], detail_hint: str) -> None:
    """Under a table with :func:`compact_reasons`: every code it shows, once, with its meaning."""
    used: dict[str, None] = {}
    for plan in plans:
        if plan.cp_off is not None:
            used[CP_OFF] = None
        for _, codes in fallback_codes(plan):
            used.update(dict.fromkeys(codes))
    if not used:
        return
    console.print(
        f"fallback reasons: phase:CODE×n = phase off for n requests (or times); {detail_hint}",
        highlight=False,
        markup=False,
        soft_wrap=False,
    )
    for code in used:
        label = short_label(code)
        name = label if label == code else f"{label} = {code}"
        meaning = MEANINGS.get(code)
        console.print(
            f"  {name}: {meaning}" if meaning else f"  {name}",
            highlight=False,
            markup=False,
            soft_wrap=False,
        )


def print_plan_legend(console: Console, plans: Iterable[ExecutionPlan]) -> None:
    """Under a table with :func:`plan_words`: the short words it shows, with their names."""
    used = {
        str(n)
        for p in plans
        for n in (p.split, p.kv_write, p.kv_read, p.output)
        if str(n) in PLAN_WORDS
    }
    if used:
        words = ", ".join(f"{PLAN_WORDS[n]} = {n}" for n in PLAN_WORDS if n in used)
        console.print(
            f"plan: split/write/read/output; {words}",
            highlight=False,
            markup=False,
            soft_wrap=False,
        )
