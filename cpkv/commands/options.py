"""The options commands share, each defined once, and :class:`RunOptions`, the typed set a run
command receives as one object; also ``--out DIR`` and what it prints.

A run command declares the run options it takes by name (:func:`takes_run_options`); typer
shows each as its own option, and the command gets them as one :class:`RunOptions`, whose
:meth:`RunOptions.settings` resolves them with the flag sources into the ``RunSettings``
handed down to the run.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape

from cpkv.common.console import err
from cpkv.common.devices import Device
from cpkv.common.settings import RunSettings, resolve_run
from cpkv.run.jobs import Backend
from cpkv.run.shadow import parse_fault
from cpkv_core.config import CpMode, IndexKDtype, Launcher, MaterializeMode, SplitGate

if TYPE_CHECKING:
    from cpkv.plots import Written


def flag_option(names: str, text: str, default: str | None, metavar: str | None = None) -> Any:
    """The ``typer.Option`` of a run option that overrides a flag: ``text``, then that the flags
    give the default (``default``, when one is named)."""
    source = "the flags" if default is None else f"the flags ({default})"
    return typer.Option(names, metavar=metavar, help=f"{text} Default: {source}.")


TraceArg = Annotated[Path, typer.Argument(metavar="TRACE", help="Trace file (JSON Lines).")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="Config file (else $CPKV_CONFIG, else ./cpkv.toml)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
PhasesOpt = Annotated[
    str | None,
    typer.Option(
        "--phases",
        metavar="LIST",
        help="Enabled phases for this run: a list (e.g. 1,2), all or none; default: the flags.",
    ),
]
CpSizeOpt = Annotated[
    int | None, flag_option("--cp-size", "CP ranks; turns CP on for the run.", "1")
]
PageSizeOpt = Annotated[int | None, flag_option("--page-size", "Tokens per KV page.", "64")]
CpModeOpt = Annotated[
    CpMode | None, flag_option("--cp-mode", "How current tokens are split.", None)
]
CpMinTokensOpt = Annotated[
    int | None,
    flag_option(
        "--nsa-prefill-cp-min-tokens",
        "Batches with fewer current tokens run unsplit (CP off for them); 0: always split.",
        "0",
        metavar="N",
    ),
]
SplitGateOpt = Annotated[
    SplitGate | None,
    flag_option(
        "--cp-split-gate",
        "Which batches are split: sglang (as SGLang 0.5.23 decides) or split-anyway (every batch).",
        "sglang",
    ),
]
MaterializeOpt = Annotated[
    MaterializeMode | None,
    flag_option(
        "--materialize",
        "How sharded reads build their view: gather (a collective) or peer-read (owners' "
        "pools in shared memory, ranks on one host).",
        "gather",
    ),
]
PrefetchOpt = Annotated[
    bool | None,
    flag_option(
        "--materialize-prefetch/--no-materialize-prefetch",
        "Fetch layer l+1's history view while layer l computes (a second view buffer).",
        "off",
    ),
]
BackendOpt = Annotated[
    Backend, typer.Option("--backend", help="gloo: one process per rank; local: threads.")
]
ModelOpt = Annotated[
    str, typer.Option("--model", metavar="NAME", help="Model preset (runs need tiny).")
]
DeviceOpt = Annotated[
    Device,
    typer.Option("--device", help="Where weights, pools and the run step live; meta: a dry run."),
]
BatchTimeoutOpt = Annotated[
    float | None,
    flag_option(
        "--batch-timeout-s",
        "Seconds a batch's collective waits for a stalled rank; then the run stops, naming "
        "the rank and the batch.",
        "60",
        metavar="SECONDS",
    ),
]
IndexDtypeOpt = Annotated[
    IndexKDtype, typer.Option("--index-k-dtype", help="Storage dtype of the indexer key cache.")
]
ShadowRateOpt = Annotated[
    float | None,
    typer.Option(
        "--shadow-rate",
        help="Share of batches (0..1) run twice and compared with the fallback path; a "
        "mismatch serves the fallback and kills the phase (default: the flag, 0).",
    ),
]
FaultOpt = Annotated[
    str | None,
    typer.Option(
        "--inject-fault",
        metavar="PHASE[:KIND][@BATCH]",
        help="Game day on phase 1, 3, 4 or 5's path, in every batch taking it or batch BATCH: "
        "KIND row, drop or owner corrupts it (use with --shadow-rate 1, or the debug checks); "
        "raise or nonfinite makes it fail on the last rank (the phase is killed, the batch "
        "rerun).",
    ),
]
LauncherOpt = Annotated[
    Launcher | None,
    flag_option(
        "--launcher",
        "What starts the CP ranks: spawn (here), torchrun (this process is one rank, env:// "
        "rendezvous, across machines), auto (torchrun when run under it).",
        "auto",
    ),
]
DecodeCpSizeOpt = Annotated[
    int | None,
    flag_option(
        "--decode-cp-size",
        "Decode CP ranks the prefill ranks re-shard to, each receiving the pages it owns "
        "(page position % M); 1: a non-CP decode server.",
        "1",
        metavar="M",
    ),
]
PdHostOpt = Annotated[
    str | None,
    flag_option(
        "--pd-host",
        "Address the decode server listens on and is reached at.",
        "127.0.0.1",
        metavar="HOST",
    ),
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """Every option of a run command, parsed; one a command does not take keeps its default
    (None: the flags decide)."""

    phases: PhasesOpt = None
    config: ConfigOpt = None
    cp_size: CpSizeOpt = None
    page_size: PageSizeOpt = None
    cp_mode: CpModeOpt = None
    cp_min_tokens: CpMinTokensOpt = None
    split_gate: SplitGateOpt = None
    materialize: MaterializeOpt = None
    materialize_prefetch: PrefetchOpt = None
    backend: BackendOpt = Backend.GLOO
    model_name: ModelOpt = "tiny"
    index_k_dtype: IndexDtypeOpt = IndexKDtype.FP8_E4M3
    device: DeviceOpt = Device.CPU
    shadow_rate: ShadowRateOpt = None
    inject_fault: FaultOpt = None
    batch_timeout_s: BatchTimeoutOpt = None
    launcher: LauncherOpt = None
    decode_cp_size: DecodeCpSizeOpt = None
    pd_host: PdHostOpt = None

    def settings(self) -> RunSettings:
        """What the run uses: the flag sources (defaults < config < environment) overridden
        by these options, with the device and the injected fault.

        Raises:
            ValueError: a malformed config, environment variable, option or phase list.
            BadInput: a malformed ``--inject-fault``.
        """
        given = {
            "attn_cp_size": self.cp_size,
            "page_size": self.page_size,
            "nsa_prefill_cp_mode": self.cp_mode,
            "nsa_prefill_cp_min_tokens": self.cp_min_tokens,
            "cp_split_gate": self.split_gate,
            "shadow_rate": self.shadow_rate,
            "batch_timeout_s": self.batch_timeout_s,
            "launcher": self.launcher,
            "pd_host": self.pd_host,
            "disaggregation_decode_cp_size": self.decode_cp_size,
            "materialize": self.materialize,
            "materialize_prefetch": self.materialize_prefetch,
        }
        settings = resolve_run(self.config, self.phases, given, self.index_k_dtype)
        fault = parse_fault(self.inject_fault)
        return dataclasses.replace(settings, device=str(self.device), fault=fault)


GATE_OPTIONS = (
    "phases",
    "config",
    "cp_size",
    "page_size",
    "cp_mode",
    "cp_min_tokens",
    "split_gate",
)
"""What the gate decides a trace with: the run options of ``explain``."""
READ_OPTIONS = ("materialize", "materialize_prefetch")
"""How sharded reads build their view."""
GUARD_OPTIONS = ("shadow_rate", "inject_fault", "batch_timeout_s")
"""What guards a live run: shadow checks, a game-day fault, the batch timeout."""
VERIFY_OPTIONS = (
    *GATE_OPTIONS,
    *READ_OPTIONS,
    "backend",
    "model_name",
    "index_k_dtype",
    "device",
    *GUARD_OPTIONS,
    "launcher",
)
"""The run options of ``cpkv verify``, in the order its help lists them."""
PD_OPTIONS = (
    *GATE_OPTIONS,
    *READ_OPTIONS,
    "device",
    *GUARD_OPTIONS,
    "decode_cp_size",
    "pd_host",
)
"""The run options of ``cpkv pd``, in the order its help lists them."""

Command = TypeVar("Command", bound=Callable[..., None])


def takes_run_options(*names: str) -> Callable[[Command], Command]:
    """Gives the decorated command the :class:`RunOptions` fields ``names``, in that order,
    as options of its own where its ``run: RunOptions`` parameter stands; the command is
    called with them as one ``RunOptions``."""
    hints = typing.get_type_hints(RunOptions, include_extras=True)
    defaults = {f.name: f.default for f in dataclasses.fields(RunOptions)}
    options = [
        inspect.Parameter(
            n, inspect.Parameter.KEYWORD_ONLY, default=defaults[n], annotation=hints[n]
        )
        for n in names
    ]

    def decorate(command: Command) -> Command:
        own = typing.get_type_hints(command, include_extras=True)
        params = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=own[p.name])
            for p in inspect.signature(command).parameters.values()
        ]
        at = next(i for i, p in enumerate(params) if p.name == "run")

        @functools.wraps(command)
        def with_options(**values: Any) -> None:
            run = RunOptions(**{name: values.pop(name) for name in names})
            command(run=run, **values)

        shown = [*params[:at], *options, *params[at + 1 :]]
        with_options.__signature__ = inspect.Signature(shown)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in shown}
        del with_options.__wrapped__  # NOTE: typer and docs read the signature above
        return typing.cast(Command, with_options)

    return decorate


def out_option(writes: str) -> Any:
    """The ``--out DIR`` option (``Annotated`` metadata) of a command that ``writes`` the
    given files there; the value is ``Path | None``."""
    return typer.Option("--out", metavar="DIR", help=f"Also write {writes} to DIR.")


def print_written(written: Written) -> None:
    """One stderr line per file written and per figure skipped."""
    for path in written.paths:
        err.print(f"wrote {escape(str(path))}", highlight=False)
    for skip in written.skipped:
        err.print(f"skipped {skip.name}.png: {escape(skip.reason)}", highlight=False)
