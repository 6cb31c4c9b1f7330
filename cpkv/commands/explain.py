"""``cpkv explain``: the gate's plan for every batch of a trace, with reasons, and the phase
mix; ``--batch N`` shows one batch in full."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cpkv.commands.options import (
    GATE_OPTIONS,
    JsonOpt,
    RunOptions,
    TraceArg,
    out_option,
    print_written,
    takes_run_options,
)
from cpkv.common.console import BadInput, bad_input_exits, emit, out, warn
from cpkv.render.batches import render_explain, render_explain_batch
from cpkv.render.decision_log import render_decision_log, render_decision_totals
from cpkv.render.reports import render_explain_summary
from cpkv.run.decision_log import read_decision_log
from cpkv.run.explain import explain_trace, parse_killed
from cpkv_core.planning import BatchSpec
from cpkv_core.traces import load_trace

DecisionLogOpt = Annotated[
    bool,
    typer.Option(
        "--decision-log",
        help="TRACE is a decision log the SGLang plugin wrote (CPKV_DECISION_LOG): show its "
        "batches and totals (the run options do not apply).",
    ),
]
SummaryOpt = Annotated[
    bool, typer.Option("--summary", help="Only the phase mix, not every batch's plan.")
]
BatchOpt = Annotated[
    int | None,
    typer.Option("--batch", metavar="N", help="Show batch N in full: requests, every reason."),
]
KilledOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--killed",
        metavar="PHASE@BATCH[:CAUSE]",
        help="Replay a kill switch a live run tripped: a shadow kill (verify's shadow.kills) "
        "is KILLED from the batch after BATCH on; a failed batch's (failures.kills[].replay, "
        "CAUSE error, debug_check or nonfinite) from BATCH on, as its rerun. Repeatable.",
    ),
]


@takes_run_options(*GATE_OPTIONS)
def explain_command(
    trace_path: TraceArg,
    run: RunOptions,
    summary: SummaryOpt = False,
    batch: BatchOpt = None,
    killed: KilledOpt = None,
    decision_log: DecisionLogOpt = False,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("explain.json and phases-by-batch.png")] = None,
) -> None:
    """The gate's BatchPlan for every batch of TRACE, with reasons, and the phase mix: the
    share of batches and tokens per phase, and fallback reasons counted by code. With
    --decision-log, the decisions a server's SGLang plugin logged instead."""
    with bad_input_exits():
        _check_out(out_dir, batch, decision_log)
    if decision_log:
        _explain_decision_log(trace_path, summary, batch, as_json)
        return
    with bad_input_exits():
        settings = run.settings()
        trace = load_trace(trace_path, settings.deploy.page_size)
        kills = parse_killed(killed or [], trace.batches)
    report = explain_trace(
        trace.batches, settings.enabled, settings.deploy, settings.ceiling, kills
    )
    warn(report.warnings)
    if batch is not None:
        with bad_input_exits():
            i = batch_index(report.batches, batch)
        document = report.to_json()["batches"][i]
        batch_plan = report.plans[i]
        emit(as_json, document, lambda: render_explain_batch(out, report.batches[i], batch_plan))
        return
    render = render_explain_summary if summary else render_explain
    emit(as_json, report.to_json(summary_only=summary), lambda: render(out, report))
    if out_dir is not None:
        from cpkv.plots import write_outputs  # NOTE: loads matplotlib only for --out
        from cpkv.plots.explain_plots import EXPLAIN_FIGURES

        documents = {"explain": report.to_json()}
        print_written(write_outputs(out_dir, "explain", documents, EXPLAIN_FIGURES))


def _check_out(out_dir: Path | None, batch: int | None, decision_log: bool) -> None:
    """``--out`` draws every batch of the trace's plan: one batch (``--batch``) or a
    server's log (``--decision-log``) has no such figure, so the pair is bad input."""
    if out_dir is None:
        return
    for given, name in ((batch is not None, "--batch"), (decision_log, "--decision-log")):
        if given:
            raise BadInput(f"--out draws every batch of the trace's plan; drop {name} or --out")


def _explain_decision_log(path: Path, summary: bool, batch: int | None, as_json: bool) -> None:
    with bad_input_exits():
        report = read_decision_log(path)
        if batch is not None:
            numbers = [logged.decision.batch for logged in report.batches]
            if batch not in numbers:
                held = f"batches {numbers[0]}-{numbers[-1]}" if numbers else "no batch"
                raise BadInput(f"--batch {batch}: the log has {held}")
            logged = report.batches[numbers.index(batch)]
    if batch is not None:
        emit(as_json, logged.to_json(), lambda: out.print_json(data=logged.to_json()))
        return
    render = render_decision_totals if summary else render_decision_log
    emit(as_json, report.to_json(summary_only=summary), lambda: render(out, report))


def batch_index(batches: tuple[BatchSpec, ...], number: int) -> int:
    """The index of batch ``number`` in ``batches``.

    Raises:
        BadInput: the trace has no such batch.
    """
    numbers = [b.batch for b in batches]
    if number not in numbers:
        raise BadInput(f"--batch {number}: the trace has batches {', '.join(map(str, numbers))}")
    return numbers.index(number)


def register(app: typer.Typer) -> None:
    """Adds ``explain`` to ``app``."""
    app.command("explain")(explain_command)
