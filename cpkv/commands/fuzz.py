"""``cpkv fuzz``: hypothesis over every input cpkv reads (the fuzzer is :mod:`cpkv.run.fuzz`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from cpkv.commands.options import JsonOpt
from cpkv.common.console import BadInput, bad_input_exits, emit, out

MinutesOpt = Annotated[
    float, typer.Option("--minutes", min=0.001, help="How long to fuzz, shared by the targets.")
]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", help="Hypothesis seed; default: a fresh one.")
]


def register(app: typer.Typer) -> None:
    """Adds ``fuzz`` to ``app``; its ``enable``/``disable`` target runs ``app``'s commands."""

    @app.command("fuzz")
    def fuzz_command(
        minutes: MinutesOpt = 1.0, seed: SeedOpt = None, as_json: JsonOpt = False
    ) -> None:
        """Fuzz every input cpkv reads (traces, config files, flag values, --from-sglang strings,
        the forward-batch adapter) with hypothesis. A case passes when it gives a result or a
        clear error (exit 2 with the line or key named). Exit 0 only when no case failed."""
        from cpkv.run.fuzz import run_fuzz  # NOTE: loads hypothesis (the dev extra) only here

        with bad_input_exits():
            try:
                report = run_fuzz(app, minutes * 60.0, seed)
            except ModuleNotFoundError as exc:
                raise BadInput(f"cpkv fuzz needs hypothesis (the dev extra): {exc}") from None
        document = report.to_json()
        emit(as_json, document, lambda: _render(document))
        raise typer.Exit(0 if report.ok else 1)


def _render(document: dict[str, Any]) -> None:
    out.print(
        f"fuzz: {document['cases']:,} cases in {document['seconds']:.1f} s, "
        f"{document['failures']} failures",
        highlight=False,
    )
    for name, target in document["targets"].items():
        out.print(f"  {name}: {target['cases']:,} cases, {target['failures']} failures")
        for example in target["examples"][:3]:
            out.print(f"    {escape(example)}", highlight=False)
