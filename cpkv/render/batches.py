"""The per-batch tables of ``verify``, ``demo`` and ``explain``, and ``explain --batch N``.

One line per batch at 100 columns (see :mod:`cpkv.render.cells`); the full reasons of a batch are
in ``--json`` and in :func:`render_explain_batch`.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cpkv.render.cells import (
    BYTES_NOTE,
    batch_table,
    compact_reasons,
    plan_words,
    print_legend,
    print_plan_legend,
    short_bytes,
)
from cpkv.run.explain import ExplainReport
from cpkv.run.failure_summary import FailureSummary
from cpkv.run.verify import VerifyReport, shadow_summary
from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime.outputs import OUTPUT_ATOL
from phases.gate import BatchPlan

FALLBACK = "fallback reasons"
"""Header of the compact reasons column."""
EXPLAIN_HINT = "full text: --json, or cpkv explain TRACE --batch N"
"""Where the full reasons are, for the legend."""


def _title(deploy: DeploymentConfig) -> str:
    return f"cp_size={deploy.cp_size} {deploy.cp_mode} page_size={deploy.page_size}"


def _check(ok: bool, topk_equal: bool, topk_mismatches: int, nonfinite: int = 0) -> str:
    if ok:
        return "yes"
    return (
        "[red]NO[/red]"
        + ("" if topk_equal else f" top-k×{topk_mismatches}")
        + (f" non-finite×{nonfinite}" if nonfinite else "")
    )


def render_verify_table(console: Console, report: VerifyReport, deploy: DeploymentConfig) -> None:
    """One line per (level, batch), the reasons legend, then a one-line verdict."""
    table = batch_table(
        f"{_title(deploy)}; the largest rank's bytes gathered and KV stored",
        ("level", "batch", "tokens", "phase", "gathered", "KV", "max|diff|", "ok"),
        (FALLBACK,),
    )
    plans = []
    for level in report.levels:
        for row in level.rows:
            cmp = row.comparison
            plans.append(row.batch_plan)
            table.add_row(
                str(row.level),
                str(row.batch),
                str(row.tokens),
                str(row.batch_plan.phase),
                short_bytes(max(row.gathered_bytes_by_rank)),
                short_bytes(max(row.kv_bytes_by_rank)),
                f"{cmp.max_abs_diff:.3g}",
                _check(cmp.ok, cmp.topk_equal, cmp.topk_mismatches, cmp.nonfinite),
                compact_reasons(row.batch_plan),
            )
    console.print(table)
    print_legend(console, plans, "full text: --json")
    console.print(BYTES_NOTE, highlight=False)
    print_verdict(console, report)


def render_verify(console: Console, report: VerifyReport, deploy: DeploymentConfig) -> None:
    """``cpkv verify``'s output: the per-batch table, then the shadow summary of a run that
    shadowed batches or injected a fault."""
    render_verify_table(console, report, deploy)
    print_shadow(console, report)


def print_shadow(console: Console, report: VerifyReport) -> None:
    """The shadow summary, when the run shadowed batches or injected a fault, then the
    failed batches' summary when a batch failed or a failing fault was injected."""
    summary = shadow_summary(report)
    if summary.rate > 0 or summary.fault is not None:
        console.print(summary.text(), highlight=False, markup=False)
    print_failures(console, report.failures)


def print_failures(
    console: Console, failures: FailureSummary | None, label: str = "failures"
) -> None:
    """The failed batches' summary, when a batch failed or a failing fault was injected."""
    if failures is not None and failures.shown:
        console.print(failures.text(label), highlight=False, markup=False)


def render_demo(console: Console, report: VerifyReport, deploy: DeploymentConfig) -> None:
    """One line per batch at the highest level: chosen phase, bytes gathered and KV per rank
    at level 0 -> the highest level, the largest difference over all levels, fallback
    reasons; then the legend, KV per rank after the trace and the verdict."""
    base, top = report.levels[0], report.levels[-1]
    table = batch_table(
        f"{_title(deploy)}: level 0 → level {top.level}, the largest rank's bytes",
        ("batch", "tokens", "phase", "gathered", "KV/rank", "max|diff|"),
        (FALLBACK,),
    )
    for i, row in enumerate(top.rows):
        rows = [level.rows[i] for level in report.levels]
        table.add_row(
            str(row.batch),
            str(row.tokens),
            str(row.batch_plan.phase),
            f"{short_bytes(max(base.rows[i].gathered_bytes_by_rank))}→"
            f"{short_bytes(max(row.gathered_bytes_by_rank))}",
            f"{short_bytes(max(base.rows[i].kv_bytes_by_rank))}→"
            f"{short_bytes(max(row.kv_bytes_by_rank))}",
            f"{max(r.comparison.max_abs_diff for r in rows):.3g}",
            compact_reasons(row.batch_plan),
        )
    console.print(table)
    print_legend(console, (r.batch_plan for r in top.rows), "full text: --json")
    console.print(BYTES_NOTE, highlight=False)
    kv0, kvn = base.rows[-1].kv_bytes_by_rank, top.rows[-1].kv_bytes_by_rank
    console.print(
        f"KV per rank after the trace: level 0 {' '.join(map(short_bytes, kv0))} | "
        f"level {top.level} {' '.join(map(short_bytes, kvn))} ({max(kvn) / max(kv0):.2f}x)",
        highlight=False,
    )
    print_verdict(console, report)


def print_verdict(console: Console, report: VerifyReport) -> None:
    """``OK: ...`` or ``FAILED: ...`` with every level's largest difference."""
    levels = "max|diff| by level " + " ".join(
        f"{lv.level}:{lv.max_abs_diff:.3g}" for lv in report.levels
    )
    if report.ok:
        console.print(
            f"[green]OK[/green]: every batch equals the reference (top-k exact, "
            f"outputs within {OUTPUT_ATOL:g}); {levels}"
        )
    else:
        bad = sum(not r.comparison.ok for lv in report.levels for r in lv.rows)
        console.print(f"[red]FAILED[/red]: {bad} batch(es) differ from the reference; {levels}")


def render_explain(console: Console, report: ExplainReport) -> None:
    """One line per batch with its plan and compact reasons, the legends, then the summary."""
    enabled = ",".join(str(int(p)) for p in sorted(report.enabled)) or "none"
    table = batch_table(
        f"{_title(report.deploy)} enabled={enabled}",
        ("batch", "tokens", "phase"),
        ("plan", FALLBACK),
    )
    for batch, plan in zip(report.batches, report.plans, strict=True):
        table.add_row(
            str(batch.batch),
            str(batch.num_tokens),
            str(plan.phase),
            plan_words(plan.plan),
            compact_reasons(plan),
        )
    console.print(table)
    print_plan_legend(console, (p.plan for p in report.plans))
    print_legend(console, report.plans, EXPLAIN_HINT)
    summary = report.summary()
    by_phase = ", ".join(
        f"phase {k}: {v} batches / {summary['tokens_by_phase'][k]} tokens"
        for k, v in summary["batches_by_phase"].items()
    )
    console.print(f"summary: {by_phase}", highlight=False)


def _requests_table(batch: BatchSpec) -> Table:
    table = Table(title=f"batch {batch.batch}: requests", title_justify="left")
    for name in ("rid", "prefix", "extend", "prefix from", "return_logprob", "capture_hidden"):
        table.add_column(name, justify="left" if name == "rid" else "right")
    for req in batch.requests:
        table.add_row(
            req.rid,
            str(req.prefix_len),
            str(req.extend_len),
            req.prefix_from or "-",
            "yes" if req.return_logprob else "no",
            "yes" if req.capture_hidden else "no",
        )
    return table


def render_explain_batch(console: Console, batch: BatchSpec, plan: BatchPlan) -> None:
    """Everything the gate decided for one batch: requests, plan, every phase with every
    reason in full."""
    p = plan.plan
    console.print(
        f"batch {batch.batch}: {batch.num_tokens} tokens, {len(batch.requests)} requests, "
        f"spec {batch.spec or '-'}, phase {plan.phase}",
        highlight=False,
    )
    console.print(
        f"plan: split {p.split}, kv write {p.kv_write}, kv read {p.kv_read}, output {p.output}",
        highlight=False,
    )
    if plan.cp_off is not None:
        console.print(f"CP off for this batch: {plan.cp_off}", highlight=False, markup=False)
    console.print(_requests_table(batch))
    decisions = Table(title=f"batch {batch.batch}: phases", title_justify="left")
    for name in ("phase", "name", "active", "reasons"):
        decisions.add_column(name)
    for d in plan.decisions:
        decisions.add_row(
            str(int(d.phase)),
            d.phase.label,
            "yes" if d.active else "no",
            "\n".join(str(r) for r in d.reasons) or "-",
        )
    console.print(decisions)
